"""The Traces screen in the real console (Textual Pilot), over a real agent and a real PyTorch trainer."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from textual.widgets import DataTable, Input, Select, Static

from testkit.traces import trainers, wait_registered
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LiveSource
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.traces import TracesScreen

pytestmark = pytest.mark.slow


async def wait_for(predicate, timeout=90.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def status(screen: TracesScreen) -> str:
    return str(screen.query_one("#traces-status", Static).render())


async def test_capture_dialog_follows_the_host_and_shows_summary_and_merged_file(agent, socket_dir, tmp_path):
    with trainers(socket_dir, [0]) as processes:
        wait_registered(agent, processes[0].pid)
        app = TuiprofApp(LiveSource([agent.address], ConnectionOptions(timeout=10)))
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.press("t")
            screen = app.screen
            assert isinstance(screen, TracesScreen)
            screen.query_one("#traces-amount", Input).value = "800"
            screen.query_one("#traces-delay", Input).value = "6000"
            screen.query_one("#traces-output", Input).value = str(tmp_path / "out")
            await pilot.press("ctrl+r")
            await wait_for(lambda: "Done in" in status(screen))
            await pilot.pause()
            assert "every rank delivered" in status(screen), status(screen)
            row = screen.query_one(DataTable).get_row(agent.address.target)
            assert row[:4] == [agent.address.target, "done", "0", "1"]
            summary_text = str(screen.query_one("#traces-summary", Static).render())
    assert screen.merged_path == tmp_path / "out" / "merged.trace.json.gz"
    assert "rank 0 on" in summary_text and str(screen.merged_path) in summary_text
    merged = json.loads(gzip.decompress(screen.merged_path.read_bytes()))
    assert any(e.get("name") == "aten::mm" for e in merged["traceEvents"])
    assert [r.rank for r in screen.summary.ranks] == [0]


async def test_form_refuses_a_span_that_does_not_fit_the_kind(agent, tmp_path):
    app = TuiprofApp(LiveSource([agent.address], ConnectionOptions(timeout=10)))
    async with app.run_test(size=(160, 50)) as pilot:
        app.push_screen(TracesScreen(output_root=tmp_path))
        await pilot.pause()
        screen = app.screen
        screen.query_one("#traces-span", Select).value = "last_events"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert status(screen).startswith("Cannot capture: last events is for timeline captures")
        screen.query_one("#traces-span", Select).value = "duration_ms"
        screen.query_one("#traces-amount", Input).value = "-5"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert status(screen) == "Cannot capture: the span must be a positive whole number, got '-5'"
        assert screen.capture is None and not list(tmp_path.iterdir())
