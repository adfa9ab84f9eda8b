"""SVG snapshots of each view at 80×24 and 200×50 (pytest-textual-snapshot), from recordings.

Update after a deliberate visual change with ``pytest tests/console/test_snapshots.py
--snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

import pytest

from console.recordings import AGENTS_RECORDING, GPU_FIXTURE, replay_app

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((200, 50), id="200x50")]

VIEWS = {
    "cluster": [],
    "cluster-filtered": ["slash", *"util<10", "enter"],
    "host-gpus": ["enter"],
    "host-cpu": ["enter", "2"],
    "host-io": ["enter", "3"],
    "host-ranks": ["enter", "4"],
    "host-pmu": ["enter", "5"],
    "host-history": ["enter", "6"],
    "host-history-1min": ["enter", "6", "z", "z", "z"],
    "host-help": ["enter", "question_mark"],
    "job-ops": ["n"],
    "stacks": ["s"],
    "help": ["question_mark"],
    "columns": ["C"],
    "host-processes-columns": ["enter", "c"],
}


async def _settle(pilot) -> None:
    app = pilot.app
    for _ in range(100):
        await pilot.pause(0.02)
        if app.cluster.version and app._rendered_version == app.cluster.version and not app._inbox:
            return


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("view", list(VIEWS))
def test_gpu_cluster_views(snap_compare, view: str, size: tuple[int, int]) -> None:
    assert snap_compare(replay_app(GPU_FIXTURE), press=VIEWS[view], terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("view", ["cluster", "host-gpus", "host-cpu", "host-io"])
def test_cpu_only_agents_views(snap_compare, view: str, size: tuple[int, int]) -> None:
    assert snap_compare(replay_app(AGENTS_RECORDING), press=VIEWS[view], terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", SIZES)
def test_traces_view(snap_compare, monkeypatch, size: tuple[int, int]) -> None:
    """The capture form; its default output folder (the working directory and the time) pinned here."""
    monkeypatch.chdir("/tmp")
    monkeypatch.setattr("tuiprof.tui.screens.traces.time.strftime", lambda fmt: "20261124-031200")
    assert snap_compare(replay_app(GPU_FIXTURE), press=["t"], terminal_size=size, run_before=_settle)


def test_light_theme(snap_compare) -> None:
    assert snap_compare(replay_app(GPU_FIXTURE), press=["T"], terminal_size=(120, 40), run_before=_settle)
