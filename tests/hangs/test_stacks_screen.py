"""The Stacks screen in the real console app (Textual Pilot) over a real agent with real ranks."""

import asyncio
import xml.etree.ElementTree as ET

from textual.widgets import Static, Tree

from agentd.stacks import ranksets
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LiveSource
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.stacks import StacksScreen


async def stop_feed(app, pilot):
    """Stop the live source and let pending renders run, so none fires while the app closes
    (the app's throttled render timer does not expect an empty screen stack)."""
    app.workers.cancel_group(app, "source")
    await pilot.pause(0.7)


async def wait_for(predicate, timeout=60.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_stacks_screen_takes_merges_jumps_toggles_and_exports(agent_with_ranks, tmp_path):
    address, _, _ = agent_with_ranks
    app = TuiprofApp(LiveSource([address], ConnectionOptions(timeout=10)))
    async with app.run_test(size=(160, 50)) as pilot:
        app.push_screen(StacksScreen(export_dir=tmp_path))
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, StacksScreen)
        await wait_for(lambda: screen.report is not None)
        await pilot.pause()
        report = screen.report
        assert [ranksets.fold(s.ranks) for s in report.suspects] == ["3"]
        classes = str(screen.query_one("#stacks-classes", Static).render())
        assert "Suspect: rank 3" in classes and "stuck_in_loader" in classes

        await pilot.press("j")
        tree = screen.query_one(Tree)
        assert str(tree.cursor_node.label).startswith("stuck_in_loader (stuck_in_loader.py)  [3] 1  not: [0-2]")

        await pilot.press("l")
        assert screen.lines and "stuck_in_loader.py:5" in str(screen.query_one("#stacks-classes", Static).render())

        # Native frames were not taken: n takes stacks again. The agent leaves a rank it has
        # just dumped alone for a while (py-spy stops the process) and serves the Python-only
        # dump again, saying so; the screen shows why and r takes them once the pause is over.
        taken = screen.report
        await pilot.press("n")
        await wait_for(lambda: screen.report is not taken)
        for _ in range(30):
            if screen._taken_native:
                break
            assert "native frames not taken" in str(screen.query_one("#stacks-status", Static).render())
            await asyncio.sleep(1.0)
            taken = screen.report
            await pilot.press("r")
            await wait_for(lambda taken=taken: screen.report is not taken)
        await pilot.pause()
        assert any(f.native for c in screen.report.classes for f in c.frames)

        await pilot.press("f", "g")
        folded = list(tmp_path.glob("tuiprof-stacks-*.folded"))
        svg = list(tmp_path.glob("tuiprof-stacks-*.svg"))
        assert len(folded) == 1 and len(svg) == 1
        assert "stuck_in_loader" in folded[0].read_text()
        ET.parse(svg[0])
        await stop_feed(app, pilot)


async def test_stacks_screen_shows_one_job_at_a_time(agent_with_two_jobs, tmp_path):
    app = TuiprofApp(LiveSource([agent_with_two_jobs], ConnectionOptions(timeout=10)))
    async with app.run_test(size=(160, 50)) as pilot:
        app.push_screen(StacksScreen(export_dir=tmp_path))
        await pilot.pause()
        screen = app.screen
        await wait_for(lambda: screen.report is not None)
        assert screen.jobs == ["a", "b"] and screen.job == "a"
        assert [ranksets.fold(s.ranks) for s in screen.report.suspects] == ["3"]
        assert "job a (1 of 2, J: next)" in str(screen.query_one("#stacks-status", Static).render())
        first = screen.report
        await pilot.press("J")
        await wait_for(lambda: screen.report is not first)
        assert screen.job == "b" and screen.report.merged.ranks.bit_count() == 2
        assert screen.report.classes[0].where().startswith("other_job_wait")
        await stop_feed(app, pilot)
