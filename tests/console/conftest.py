"""Fixtures for the console tests."""

from __future__ import annotations

import pytest

from console.recordings import GPU_FIXTURE, replay_app
from tuiprof.tui.app import TuiprofApp


@pytest.fixture
def gpu_app() -> TuiprofApp:
    """The console over the synthetic 4-host GPU recording."""
    return replay_app(GPU_FIXTURE)


async def open_host_tab(app: TuiprofApp, pilot, tab: str):
    """Host n1's ``tab`` in the host view, once the replayed snapshot is in; the screen shown."""
    for _ in range(50):
        await pilot.pause(0.02)
        if app.cluster.version:
            break
    app.show_host("n1", tab=tab)
    await pilot.pause(0.1)
    return app.screen
