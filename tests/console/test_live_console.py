"""The live console over real agents: a silent host never holds up the screen or the keys."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from testkit.agents import running_agent
from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LiveSource
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.help import HelpScreen

pytestmark = pytest.mark.slow


@pytest.fixture
def silent_address():
    """127.0.0.3:PORT accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield AgentAddress("127.0.0.3", listener.getsockname()[1])
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


async def test_silent_host_does_not_freeze_the_screen(tmp_path, silent_address) -> None:
    with running_agent(tmp_path, host="127.0.0.2", interval_ms=200) as agent:
        options = ConnectionOptions(timeout=2.0)
        app = TuiprofApp(LiveSource([silent_address, agent.address], options))
        async with app.run_test(size=(120, 30)) as pilot:
            real, silent = agent.address.target, str(silent_address)
            start = time.monotonic()
            while app.cluster.host(real).message is None and time.monotonic() - start < 10:
                await pilot.pause(0.05)
            assert app.cluster.host(real).reachable is True
            assert time.monotonic() - start < 1.9  # before the silent host's GetInfo times out
            assert app.cluster.host(silent).reachable is None  # still waiting on it
            await pilot.press("question_mark")  # keys answer meanwhile
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            while app.cluster.host(silent).reachable is None and time.monotonic() - start < 10:
                await pilot.pause(0.05)
            state = app.cluster.host(silent)
            assert state.reachable is False and state.error == "no answer within 2 s"
            sequence = app.cluster.host(real).message.sequence
            await pilot.pause(0.6)
            assert app.cluster.host(real).message.sequence > sequence  # the real host kept streaming
