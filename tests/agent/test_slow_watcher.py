"""A client that never reads must not stall other watchers, nor make the agent queue snapshots."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import grpc

from agentd.config import AgentConfig
from agentd.daemon import Daemon
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc

INTERVAL_MS = 100
# A small receive window and no window growth, so the stuck client's buffers fill fast.
STUCK_CLIENT_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.max_frame_size", 16384),
                        ("grpc.max_receive_message_length", 1 << 20)]


async def test_a_stuck_watcher_skips_snapshots_while_a_reader_gets_every_one(tmp_path):
    daemon = Daemon(
        AgentConfig(host="127.0.0.1", port=0, metrics_port=None, interval_ms=INTERVAL_MS,
                    trace_dir=tmp_path / "traces"),
        collectors=["testkit.agents:FatCollector"],
    )
    endpoints = await daemon.start()
    target = endpoints.address.target
    try:
        async with grpc.aio.insecure_channel(target, options=STUCK_CLIENT_OPTIONS) as stuck_channel, \
                grpc.aio.insecure_channel(target) as reader_channel:
            stuck = pb_grpc.AgentStub(stuck_channel).Watch(pb.WatchRequest(), timeout=60)
            first = await stuck.read()  # the stream is open; from here on it never reads

            reader = pb_grpc.AgentStub(reader_channel).Watch(pb.WatchRequest(), timeout=60)
            sequences = []
            async for snapshot in reader:
                sequences.append(snapshot.sequence)
                if len(sequences) == 40:  # 4 s: far more than the stuck client's window holds
                    break
            reader.cancel()

            assert daemon.agent is not None and daemon.agent.watcher_count >= 1
            # The reader saw every snapshot after its first, in order, on time.
            assert sequences[1:] == list(range(sequences[1], sequences[1] + 39))
            # The stuck client now reads what was buffered for it: then the stream jumps
            # to the newest snapshot, because nothing was queued while it did not read.
            received = [first.sequence]
            while received[-1] < sequences[-1]:
                received.append((await asyncio.wait_for(stuck.read(), 5)).sequence)
            stuck.cancel()
    finally:
        await daemon.stop()

    # What HTTP/2 flow control let through before the client stopped, then the newest.
    jumps = [b - a for a, b in pairwise(received)]
    assert max(jumps) > 5, f"the stuck watcher got every snapshot: {received}"
    assert len(received) < len(sequences), received
