"""agentd's server threads sleep until there is work: no polling while nothing comes.

A thread that wakes on a timer to check a stop flag costs a scheduler slice and a GIL
hand-off each time, for nothing (bench/agent/agentd_cpu.md). The kernel counts a thread's
voluntary context switches: one that sleeps in select() until woken makes none.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import tempfile
import threading
import time

import httpx

from agentd.agent import Agent
from agentd.kineto import wire
from agentd.kineto.endpoint import KinetoEndpoint
from agentd.kineto.registry import Registry
from agentd.metrics_http import MetricsServer
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.traces import KinetoClient

# Long enough for a 0.5 s poll to wake three times.
IDLE_SECONDS = 1.6


def voluntary_switches(thread: threading.Thread) -> int:
    status = pathlib.Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)$", status, re.M)
    assert found is not None
    return int(found.group(1))


def wakeups_while_idle(thread: threading.Thread) -> int:
    time.sleep(0.2)  # the thread reaches its wait
    before = voluntary_switches(thread)
    time.sleep(IDLE_SECONDS)
    return voluntary_switches(thread) - before


def stop_seconds(stop) -> float:
    started = time.monotonic()
    stop()
    return time.monotonic() - started


def test_an_idle_kineto_endpoint_sleeps_until_a_datagram_and_stops_at_once():
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    endpoint = KinetoEndpoint(Registry(), str(socket_dir))
    client = KinetoClient(socket_dir)
    try:
        assert wakeups_while_idle(endpoint._thread) == 0
        client.send(wire.poll_request(3, 7, (os.getpid(), os.getppid())))
        assert client.reply() == wire.poll_reply("")  # still answering
    finally:
        client.close()
        took = stop_seconds(endpoint.close)
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert not endpoint._thread.is_alive() and took < 0.4
    endpoint.close()  # a second close is harmless


def test_an_idle_metrics_server_sleeps_until_a_connection_and_stops_at_once():
    agent = Agent([], interval_seconds=1.0)
    server = MetricsServer("127.0.0.1", 0)
    server.start(agent, lambda: pb.AgentInfo())
    try:
        assert wakeups_while_idle(server._thread) == 0
        agent.publish(agent.snapshot())
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).text == "ok\n"
    finally:
        took = stop_seconds(server.stop)
    assert not server._thread.is_alive() and took < 0.4
