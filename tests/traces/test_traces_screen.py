"""The Traces screen in the real console (Textual Pilot), over a real agent and a real PyTorch trainer."""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib
import shutil

import pytest
from textual.widgets import DataTable, Input, Select, Static

from testkit.traces import run_cli, trainers, wait_registered
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LiveSource
from tuiprof.model.capture import ClusterCapture, FetchedFile, HostProgress
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


async def test_capture_dialog_shows_the_agents_summary_and_opens_the_merged_timeline_on_demand(agent, socket_dir, tmp_path):
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
            assert ": every rank wrote its file;" in status(screen), status(screen)
            # The agent's summary, the file still on its node.
            row = screen.query_one(DataTable).get_row(agent.address.target)
            assert row[:5] == [agent.address.target, "done", "rank 0", "1 on node", "1 written"]
            assert "rank 0 on" in str(screen.query_one("#traces-summary", Static).render())
            assert screen.merged_path is None and not (tmp_path / "out").exists()
            await pilot.press("m")  # open the merged timeline: fetch and merge
            await wait_for(lambda: "Merged timeline:" in status(screen))
            await pilot.pause()
            assert screen.query_one(DataTable).get_row(agent.address.target)[3] == "1 on node, 1 here"
            summary_text = str(screen.query_one("#traces-summary", Static).render())
            # The same capture counted again with the other step window: re-summarised, not re-captured
            screen.query_one("#traces-steps", Select).value = "complete"
            await wait_for(lambda: "Summary counts complete steps" in status(screen))
            assert "counted: " in str(screen.query_one("#traces-summary", Static).render())
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


CORPUS_RANK0 = pathlib.Path(__file__).parent / "data" / "corpus" / "hta_nccl_rank0.json.gz"


def counted_line(text: str) -> str:
    return next(line for line in text.splitlines() if "counted: " in line).split("counted: ", 1)[1]


async def test_steps_choice_counts_as_the_cli_does(agent, tmp_path):
    """A capture whose fetched file is a real two-step trace: switching the Count choice re-summarises
    it, and the counted line is the one `tuiprof analyze --steps` prints for the same file."""
    local = tmp_path / "host" / CORPUS_RANK0.name
    local.parent.mkdir()
    shutil.copy(CORPUS_RANK0, local)
    fetched = FetchedFile(host="gpu-host", pid=4242, rank=0, remote=CORPUS_RANK0.name, local=local)
    app = TuiprofApp(LiveSource([agent.address], ConnectionOptions(timeout=10)))
    async with app.run_test(size=(160, 50)) as pilot:
        app.push_screen(TracesScreen(output_root=tmp_path))
        await pilot.pause()
        screen = app.screen
        screen.capture = ClusterCapture(0, [HostProgress("gpu-host", phase="done", files=[fetched])])
        screen.merged_path = tmp_path / "merged.trace.json.gz"
        texts = {}
        for mode in ("complete", "all"):
            screen.query_one("#traces-steps", Select).value = mode
            await wait_for(lambda mode=mode: f"Summary counts {'complete' if mode == 'complete' else 'all'} steps"
                           in status(screen))
            await pilot.pause()
            texts[mode] = str(screen.query_one("#traces-summary", Static).render())
    for mode, text in texts.items():
        cli = run_cli("analyze", str(CORPUS_RANK0), "--steps", mode)
        assert cli.returncode == 0, cli.stderr
        assert counted_line(text) == counted_line(cli.stdout)
    assert counted_line(texts["complete"]).startswith("steps 1–1 of 2 (ProfilerStep#551–#551")
    assert counted_line(texts["all"]) == "whole trace, all 2 steps, 1,204 GPU events"
