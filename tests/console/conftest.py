"""Fixtures for the console tests."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from console.recordings import GPU_FIXTURE, replay_app
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.job_ops import JobOpsScreen


@pytest.fixture
def gpu_app() -> TuiprofApp:
    """The console over the synthetic 4-host GPU recording."""
    return replay_app(GPU_FIXTURE)


async def wait_for_first_snapshot(app: TuiprofApp, pilot) -> None:
    for _ in range(50):
        await pilot.pause(0.02)
        if app.cluster.version:
            return


async def open_job_ops(app: TuiprofApp, pilot) -> DataTable:
    """The NCCL/GEMM view (key n) once the replayed snapshot is in; its table."""
    await wait_for_first_snapshot(app, pilot)
    await pilot.press("n")
    await pilot.pause(0.1)
    assert isinstance(app.screen, JobOpsScreen)
    return app.screen.query_one("#ops", DataTable)


async def open_host_tab(app: TuiprofApp, pilot, tab: str):
    """Host n1's ``tab`` in the host view, once the replayed snapshot is in; the screen shown."""
    await wait_for_first_snapshot(app, pilot)
    app.show_host("n1", tab=tab)
    await pilot.pause(0.1)
    return app.screen
