"""Reconnect now: a client waiting out a long backoff reconnects at once when asked (the console's R)."""

from __future__ import annotations

import asyncio
import subprocess

from testkit.agents import agentd_command, healthz_status, running_agent, stop_process
from tuiprof.client.backoff import Backoff
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import HostClient, RetryNow
from tuiprof.client.sources import LiveSource
from tuiprof.model.events import HostUnreachable, InfoReceived
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.help import key_groups


async def _until(predicate, seconds: float) -> bool:
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


async def test_a_down_host_reconnects_at_once_when_asked(tmp_path):
    events: list = []
    retry = RetryNow()
    with running_agent(tmp_path) as first:
        client = HostClient(first.address, ConnectionOptions(timeout=2), events.append,
                            backoff=Backoff(initial=30.0, maximum=30.0), retry=retry)
        task = asyncio.create_task(client.run())
        assert await _until(lambda: any(isinstance(e, InfoReceived) for e in events), 20)
    try:
        assert await _until(lambda: isinstance(events[-1], HostUnreachable), 20)
        again = subprocess.Popen(agentd_command(["--port", str(first.port), "--metrics-port", str(first.metrics_port),
                                                 "--trace-dir", str(first.trace_dir)]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert await _until(lambda: healthz_status("127.0.0.1", first.metrics_port) == 200, 30)
            await asyncio.sleep(1.0)
            assert isinstance(events[-1], HostUnreachable)  # the 30 s backoff still runs
            asked_at = len(events)
            retry.trigger()
            assert await _until(lambda: any(isinstance(e, InfoReceived) for e in events[asked_at:]), 5)
        finally:
            stop_process(again)
    finally:
        task.cancel()


async def test_R_in_the_console_wakes_the_waiting_clients():
    source = LiveSource([], ConnectionOptions())
    app = TuiprofApp(source)
    async with app.run_test(size=(120, 30)) as pilot:
        waiting = asyncio.create_task(source.retry.sleep(60))
        await pilot.pause(0.1)
        await pilot.press("R")
        assert await asyncio.wait_for(waiting, 2) is True
        assert any("every host is connected" in n.message for n in app._notifications)
        assert ("R", "Reconnect now") in key_groups(app.screen)["Everywhere"]  # listed by ?
