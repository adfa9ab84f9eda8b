"""The embedded agent the console starts when no host is given."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import grpc
import pytest

from agentd.embedded import start_embedded_agent
from agentd.errors import ConfigError
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import ConnectionOptions, open_channel
from tuiprof.client.local import embedded_agent, watch_embedded
from tuiprof.model.events import HostUnreachable, InfoReceived, SnapshotReceived


async def test_embedded_agent_serves_grpc_on_a_free_loopback_port_once_asked(tmp_path, monkeypatch):
    """Its port is bound at start (no other program may take it) and refuses connections until
    ``serve_grpc`` (gRPC's threads cost CPU even idle); then GetInfo and Watch are answered there."""
    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)
    agent = start_embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces")
    try:
        assert agent.address.host == "127.0.0.1" and agent.address.port > 0
        assert agent.endpoints.metrics_port is None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((agent.address.host, agent.address.port), timeout=5).close()
        with socket.socket() as squatter, pytest.raises(OSError, match="in use"):
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind((agent.address.host, agent.address.port))
        agent.serve_grpc()
        agent.serve_grpc()  # once serving, asking again changes nothing
        async with open_channel(agent.address) as channel:
            stub = pb_grpc.AgentStub(channel)
            info = await stub.GetInfo(pb.GetInfoRequest(), timeout=10)
            call = stub.Watch(pb.WatchRequest(), timeout=10)
            sequences = []
            async for snapshot in call:
                sequences.append(snapshot.sequence)
                if len(sequences) == 3:
                    break
            call.cancel()
        assert info.interval_seconds == pytest.approx(0.1)
        assert sequences == sorted(sequences) and len(set(sequences)) == 3
    finally:
        agent.stop()
    assert not any(t.name == "embedded-agentd" for t in threading.enumerate())
    async with open_channel(agent.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=2)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    agent.stop()  # a second stop is harmless


def test_embedded_agent_start_errors_reach_the_caller(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create trace directory"):
        start_embedded_agent(trace_dir=blocker / "traces")


def _watch_over_grpc(address, count, got=None):
    """The first ``count`` snapshots the embedded agent's gRPC Watch streams to this process
    (appended to ``got`` as they come)."""
    got = [] if got is None else got

    async def watch():
        async with open_channel(address) as channel:
            call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=20)
            async for snapshot in call:
                got.append(snapshot)
                if len(got) == count:
                    call.cancel()
                    break
        return got
    return watch()


async def test_the_console_takes_the_same_snapshots_in_process_as_over_grpc(tmp_path, monkeypatch):
    """The in-process feed: GetInfo's answer first, then every published snapshot, equal to what
    the gRPC Watch streams to this process's user, under the agent's address as host name."""
    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)
    agent = start_embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces")
    agent.serve_grpc()
    try:
        events = []
        enough = asyncio.Event()

        def emit(event):
            events.append(event)
            if sum(isinstance(e, SnapshotReceived) for e in events) == 6:
                enough.set()

        grpc_watch = asyncio.ensure_future(_watch_over_grpc(agent.address, 6))
        watcher = asyncio.create_task(watch_embedded(agent, ConnectionOptions(interval_ms=100), emit))
        await asyncio.wait_for(enough.wait(), 20)
        over_grpc = await asyncio.wait_for(grpc_watch, 20)
        async with open_channel(agent.address) as channel:
            info = await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    finally:
        agent.stop()
    assert isinstance(events[0], InfoReceived) and {e.host for e in events} == {str(agent.address)}
    assert events[0].message.hostname == info.hostname
    assert events[0].message.interval_seconds == info.interval_seconds
    assert [c.name for c in events[0].message.collectors] == [c.name for c in info.collectors]
    in_process = [e.message for e in events[1:]]
    assert all(isinstance(e, SnapshotReceived) for e in events[1:])
    sequences = [s.sequence for s in in_process]
    assert sequences == sorted(set(sequences))
    # Taken when due, on the console's timer: none skipped (one at most on a loaded machine).
    assert sequences[-1] - sequences[0] <= len(sequences), sequences
    by_sequence = {s.sequence: s for s in in_process}
    shared = [s for s in over_grpc if s.sequence in by_sequence]
    assert len(shared) >= 3  # both watched the same snapshots
    for snapshot in shared:
        assert by_sequence[snapshot.sequence] == snapshot


async def _published_after(agent, sequence: int) -> pb.HostSnapshot:
    """The agent's first snapshot newer than ``sequence``, as ``EmbeddedAgent.latest`` gives it."""
    for _ in range(400):
        latest = agent.latest()
        if latest is not None and latest.snapshot.sequence > sequence:
            return latest.snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"no snapshot after {sequence} within 20 s")


async def test_the_in_process_feed_shows_private_fields_as_the_grpc_watch_does(tmp_path, monkeypatch):
    """A rank's exception text is private to its owner: the in-process feed applies the rule the gRPC
    Watch applies to this process's caller (its effective uid)."""
    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)
    agent = start_embedded_agent(interval_ms=60_000, trace_dir=tmp_path / "traces")
    agent.serve_grpc()
    try:
        crafted = pb.HostSnapshot(hostname="crafted", sequence=10**6)
        crafted.ranks.add(pid=4242, uid=os.geteuid() + 1, exception="Traceback: secret")
        crafted.ranks.add(pid=4343, uid=os.geteuid(), exception="Traceback: mine")
        streamed: list[pb.HostSnapshot] = []
        grpc_watch = asyncio.ensure_future(_watch_over_grpc(agent.address, 2, streamed))
        first = await _published_after(agent, 0)  # the agent's first snapshot
        while not streamed:  # the gRPC Watch has it too
            await asyncio.sleep(0.05)
        crafted.timestamp_unix_ns = time.time_ns()  # after the first: Watch sends newer ones only
        agent._loop.call_soon_threadsafe(agent._agent.publish, crafted)
        taken = await _published_after(agent, first.sequence)
        over_grpc = await asyncio.wait_for(grpc_watch, 20)
    finally:
        agent.stop()
    assert first.sequence == over_grpc[0].sequence
    assert taken == over_grpc[1] and taken.hostname == "crafted"
    assert taken.ranks[1].exception == "Traceback: mine"
    if os.geteuid() != 0:  # root sees everything, over gRPC as in-process
        assert taken.ranks[0].exception == "" and "private" in taken.ranks[0].unavailable["exception"]


async def test_an_embedded_agent_that_stops_sampling_shows_as_unreachable(tmp_path, monkeypatch):
    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)
    agent = start_embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces")
    events = []
    options = ConnectionOptions(interval_ms=100, timeout=0.5)
    watcher = asyncio.create_task(watch_embedded(agent, options, events.append))
    try:
        while not any(isinstance(e, SnapshotReceived) for e in events):
            await asyncio.sleep(0.05)
        await asyncio.to_thread(agent.stop)
        await asyncio.sleep(1.5)
    finally:
        watcher.cancel()
        agent.stop()
    down = [e for e in events if isinstance(e, HostUnreachable)]
    assert down and down[0].error == "no snapshot from the embedded agent for 0.5 s"
    assert down[0].host == str(agent.address)


def embedded_agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "embedded-agentd"]


async def test_a_console_quitting_while_its_agent_starts_leaves_no_agent_running(tmp_path):
    """Cancelled mid-start (a console quit in its first second), ``embedded_agent`` waits for the
    start its thread is making, stops that agent and re-raises: no agent thread outlives it (one
    that did died at interpreter exit with a traceback)."""
    before = embedded_agent_threads()

    async def use_it() -> None:
        async with embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces"):
            raise AssertionError("not reached: cancelled while starting")

    task = asyncio.create_task(use_it())
    deadline = time.monotonic() + 10
    while not set(embedded_agent_threads()) - set(before):  # the agent's thread is up: it is starting
        assert time.monotonic() < deadline, "the embedded agent never started"
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert embedded_agent_threads() == before


async def test_a_console_agent_reads_the_pmu_only_while_a_screen_shows_it(tmp_path, monkeypatch):
    """``pmu_when_shown`` (the console's agent): the snapshots have no host-wide PMU readings and
    say why until ``sample_pmu(True)``, then they have them, until ``sample_pmu(False)``."""
    from agentd.embedded import PMU_RESTING

    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)

    taken = 0

    async def next_snapshots(count: int) -> list[pb.HostSnapshot]:
        nonlocal taken
        snapshots = []
        for _ in range(count):
            snapshots.append(await _published_after(agent, taken))
            taken = snapshots[-1].sequence
        return snapshots

    def pmu_status(snapshot: pb.HostSnapshot) -> pb.CollectorStatus:
        return next(c for c in snapshot.collectors if c.name == "pmu")

    agent = start_embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces", pmu_when_shown=True)
    try:
        # read by the snapshot tick (they never block): no thread of their own wakes each second
        assert not {"collector-pmu", "collector-kineto"} & {thread.name for thread in threading.enumerate()}
        for snapshot in await next_snapshots(3):
            assert not snapshot.HasField("pmu")
            assert (pmu_status(snapshot).available, pmu_status(snapshot).reason) == (False, PMU_RESTING)
        agent.sample_pmu(True)
        # the first read after waking is a first sample; rates from the second on
        shown = await next_snapshots(1)
        while not shown[-1].pmu.HasField("page_faults_per_s"):  # counted by root and by a user alike
            assert len(shown) < 100, "no PMU rates 10 s after sample_pmu(True)"
            shown += await next_snapshots(1)
        pmu = shown[-1].pmu
        assert pmu_status(shown[-1]).available and pmu.HasField("page_faults_per_s")
        # counted, or (a user counting user space only) said why not
        assert pmu.context_switches_per_s > 0 or "perf_event_paranoid" in pmu.unavailable["context_switches_per_s"]
        agent.sample_pmu(False)
        hidden = (await next_snapshots(2))[-1]
        assert not hidden.HasField("pmu") and pmu_status(hidden).reason == PMU_RESTING
    finally:
        agent.stop()
