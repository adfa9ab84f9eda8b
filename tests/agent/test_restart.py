"""A graceful restart: the agent stopped with SIGTERM while a console watches binds again at once."""

from __future__ import annotations

import asyncio
import subprocess
import time

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import agentd_command, healthz_status, running_agent, stop_process
from tuiprof.client.channel import open_channel


async def _watch_then_stop(agent) -> None:
    """Attach a Watch stream, take one snapshot, then SIGTERM the agent under it."""
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=20)
        await call.read()
        # The agent closes the console's connection first, leaving it in TIME_WAIT.
        assert await asyncio.to_thread(stop_process, agent.process) == 0
        call.cancel()


def _serves_within(process: subprocess.Popen[bytes], port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        if healthz_status("127.0.0.1", port) == 200:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_with_a_console_attached_then_start_on_the_same_ports_at_once(tmp_path):
    with running_agent(tmp_path) as first:
        asyncio.run(_watch_then_stop(first))
    again = agentd_command(["--port", str(first.port), "--metrics-port", str(first.metrics_port),
                            "--trace-dir", str(first.trace_dir)])
    second = subprocess.Popen(again, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _serves_within(second, first.metrics_port, 30), second.communicate(timeout=10)[1].decode()
    finally:
        assert stop_process(second) == 0
