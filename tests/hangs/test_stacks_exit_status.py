"""`tuiprof stacks` exit status for scripts (3: a hang reported) and hosts without ranks, in the CLI
and on the Stacks screen (one clear line, no "Classes of None", no empty export files)."""

import asyncio
import contextlib
import os
import signal

from textual.widgets import Static

from agentd.config import AgentConfig
from agentd.daemon import Daemon
from hangs.conftest import tuiprof_cli
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LiveSource
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.stacks import StacksScreen


@contextlib.asynccontextmanager
async def agent_without_ranks(tmp_path):
    """A real in-process agent (gRPC, hang service) whose only collector reports no ranks."""
    config = AgentConfig(port=0, metrics_port=None, interval_ms=100, trace_dir=tmp_path / "traces")
    daemon = Daemon(config, collectors=["testkit.agents:TickCollector"])
    endpoints = await daemon.start()
    try:
        yield endpoints.address
    finally:
        await daemon.stop()


async def test_stacks_exits_3_while_an_agent_reports_a_hang(agent_with_ranks):
    address, procs, _ = agent_with_ranks
    code, _, err = await tuiprof_cli("stacks", "--json", address.target)
    assert code == 0, err
    os.kill(procs[2].pid, signal.SIGSTOP)  # stopped: a suspect at once, hung after 2 s
    try:
        await asyncio.sleep(2.5)
        code, out, err = await tuiprof_cli("stacks", address.target)
    finally:
        os.kill(procs[2].pid, signal.SIGCONT)
    assert code == 3, out + err
    assert "rank 2: stopped (SIGSTOP or a debugger)" in out


async def test_stacks_of_hosts_without_ranks_say_so(tmp_path):
    svg = tmp_path / "flame.svg"
    async with agent_without_ranks(tmp_path) as address:
        code, out, err = await tuiprof_cli("stacks", "--svg", str(svg), address.target)
    assert code == 0 and out == "", err
    assert err.splitlines()[-1] == ("tuiprof stacks: no ranks on these hosts: no stacks to merge "
                                    "(start the job with `tuiprof run`)")
    assert "None" not in err and not svg.exists()


async def test_stacks_screen_without_ranks_says_so_and_exports_nothing(tmp_path):
    exports = tmp_path / "exports"
    exports.mkdir()
    async with agent_without_ranks(tmp_path) as address:
        app = TuiprofApp(LiveSource([address], ConnectionOptions(timeout=10)))
        async with app.run_test(size=(120, 40)) as pilot:
            app.push_screen(StacksScreen(export_dir=exports))
            await pilot.pause()
            screen = app.screen
            while screen.report is None:
                await asyncio.sleep(0.1)
            await pilot.pause()
            classes = str(screen.query_one("#stacks-classes", Static).render())
            assert classes.startswith("No ranks on these hosts") and "None" not in classes
            await pilot.press("f", "g")
            assert list(exports.iterdir()) == []
            assert any("No stacks to export" in n.message for n in app._notifications)
            app.workers.cancel_group(app, "source")
            await pilot.pause(0.7)
