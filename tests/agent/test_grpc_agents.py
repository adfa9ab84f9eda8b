"""Real agentd processes on two loopback addresses, queried by real gRPC clients."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from itertools import pairwise

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import running_agent
from tuiprof.client.channel import open_channel

INTERVAL_MS = 200


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """Two agents, on 127.0.0.1 and 127.0.0.2 (both loopback on Linux)."""
    tmp = tmp_path_factory.mktemp("agents")
    with running_agent(tmp, host="127.0.0.1", interval_ms=INTERVAL_MS) as first, \
            running_agent(tmp, host="127.0.0.2", interval_ms=INTERVAL_MS) as second:
        yield first, second


async def test_get_info_from_both_addresses(agents):
    for agent in agents:
        async with open_channel(agent.address) as channel:
            info = await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
        assert info.hostname == socket.gethostname()
        assert info.interval_seconds == pytest.approx(INTERVAL_MS / 1000)
        assert info.cpu_count == os.cpu_count()
        assert info.kernel_release == os.uname().release
        assert info.trace_dir == str(agent.trace_dir) and agent.trace_dir.is_dir()
        assert info.memory_total_bytes > 0 and info.agent_version
        statuses = {c.name: c for c in info.collectors}
        assert statuses["host"].available
        gpu = statuses["gpu"]
        if not gpu.available:  # no NVIDIA driver here: said so, and no GPU invented
            assert gpu.reason and not info.gpus and not info.driver_version


async def test_watch_streams_consecutive_snapshots_with_host_data(agents):
    agent = agents[1]
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(interval_ms=0), timeout=20)
        snapshots = []
        async for snapshot in call:
            snapshots.append(snapshot)
            if len(snapshots) == 6:
                break
        call.cancel()
    sequences = [s.sequence for s in snapshots]
    # The first is the newest existing one; the rest follow one per interval.
    assert sequences[1:] == list(range(sequences[1], sequences[1] + 5))
    gaps = [(b.timestamp_unix_ns - a.timestamp_unix_ns) / 1e9 for a, b in pairwise(snapshots[1:])]
    assert all(0.1 < gap < 0.4 for gap in gaps), gaps
    last = snapshots[-1]
    assert last.hostname == socket.gethostname()
    assert last.memory.total_bytes > 0 and last.cpu.HasField("user_percent")
    assert abs(last.timestamp_unix_ns - time.time_ns()) < 5e9


async def test_watch_interval_thins_the_stream(agents):
    async with open_channel(agents[0].address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(interval_ms=600), timeout=20)
        snapshots = []
        async for snapshot in call:
            snapshots.append(snapshot)
            if len(snapshots) == 3:
                break
        call.cancel()
    gaps = [(b.timestamp_unix_ns - a.timestamp_unix_ns) / 1e9 for a, b in pairwise(snapshots)]
    assert all(0.59 < gap < 0.9 for gap in gaps), gaps


async def test_many_watchers_at_once(agents):
    async def watch(n: int) -> list[int]:
        async with open_channel(agents[0].address) as channel:
            call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=20)
            sequences = []
            async for snapshot in call:
                sequences.append(snapshot.sequence)
                if len(sequences) == n:
                    break
            call.cancel()
            return sequences

    results = await asyncio.gather(*(watch(4) for _ in range(20)))
    assert all(len(r) == 4 for r in results)
    # They all saw the same agent's snapshots: the last sequences are near one another.
    lasts = [r[-1] for r in results]
    assert max(lasts) - min(lasts) <= 2


# ---------------------------------------------------------------- fuzzing request fields
# Synchronous clients: hypothesis drives plain functions, and each example stays short.


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(interval_ms=st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 199, 200, 201, 2**32 - 1])))
def test_watch_any_interval_gets_the_newest_snapshot_at_once(agents, interval_ms):
    agent = agents[0]
    with grpc.insecure_channel(agent.address.target) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(interval_ms=interval_ms), timeout=10)
        first = next(call)
        if interval_ms <= INTERVAL_MS:
            second = next(call)
            assert second.sequence > first.sequence
        call.cancel()
    assert first.sequence >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GetInfo", "Watch", "CaptureTrace", "GetCaptureStatus", "FetchFile",
                               "GetStacks"]),
       body=st.binary(max_size=64))
def test_arbitrary_request_bytes_get_a_status_and_the_agent_lives_on(agents, method, body):
    agent = agents[1]
    with grpc.insecure_channel(agent.address.target) as channel:
        path = f"/tuiprof.v1.Agent/{method}"
        streaming = method in ("Watch", "FetchFile")
        call = (channel.unary_stream if streaming else channel.unary_unary)(path)
        try:
            reply = call(body, timeout=10)
            if streaming:
                next(iter(reply))
                reply.cancel()
        except grpc.RpcError as error:
            # A refusal says why. UNKNOWN means an exception escaped a handler: allowed
            # only for bytes that are no protobuf at all (grpc rejects them before us).
            assert error.details(), error
            if error.code() == grpc.StatusCode.UNKNOWN:
                assert "Error parsing message" in error.details(), error
            assert error.code() != grpc.StatusCode.UNAVAILABLE, error
        info = pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
        assert info.hostname
    assert agent.process.poll() is None
