"""/metrics renders a snapshot's exposition once and serves every scrape of it the same bytes (issue 24 item 4)."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx

from agentd.agent import Agent
from agentd.metrics_http import MAX_CONNECTIONS_PER_PEER, MetricsServer
from agentd.proto import tuiprof_agent_pb2 as pb

SCRAPES = MAX_CONNECTIONS_PER_PEER  # all at once, none past the bound


def test_concurrent_scrapes_of_one_snapshot_share_one_rendering_and_a_new_snapshot_gets_its_own():
    agent = Agent([], interval_seconds=1.0, hostname="h")
    server = MetricsServer("127.0.0.1", 0)
    rendered: list[int] = []
    lock = threading.Lock()
    render = server._renderer
    assert not isinstance(render, str), render

    def counted(latest, previous, info, runs) -> str:
        with lock:
            rendered.append(latest.sequence)
        return render(latest, previous, info, runs)

    server._renderer = counted
    server.start(agent, lambda: pb.AgentInfo(hostname="h"))
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        agent.publish(agent.snapshot())
        with concurrent.futures.ThreadPoolExecutor(SCRAPES) as pool:
            bodies = list(pool.map(lambda _: httpx.get(url, timeout=10).content, range(SCRAPES)))
        agent.publish(agent.snapshot())
        after = httpx.get(url, timeout=10).content
    finally:
        server.stop()
    assert rendered == [1, 2]
    assert len(set(bodies)) == 1 and b"tuiprof_snapshot_timestamp_seconds" in bodies[0]
    assert after != bodies[0]
