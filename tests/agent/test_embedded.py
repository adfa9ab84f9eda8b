"""The embedded agent the console starts when no host is given."""

from __future__ import annotations

import threading

import grpc
import pytest

from agentd.embedded import start_embedded_agent
from agentd.errors import ConfigError
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import open_channel


async def test_embedded_agent_serves_grpc_on_a_free_loopback_port(tmp_path, monkeypatch):
    monkeypatch.delenv("TUIPROF_TOKEN", raising=False)
    agent = start_embedded_agent(interval_ms=100, trace_dir=tmp_path / "traces")
    try:
        assert agent.address.host == "127.0.0.1" and agent.address.port > 0
        assert agent.endpoints.metrics_port is None
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
