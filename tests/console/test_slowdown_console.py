"""The slowdown verdict in the console: joined across hosts, shown in the cluster banner and the
NCCL/GEMM view, the same from a recording.

The job: ranks 0-2 on node-a, rank 3 alone on node-b, rank 3 late at each step's first
collective. Each agent judges its own host only: node-a's ranks arrive together, node-b has
one rank, so neither agent names anyone (node-a's sees the step grow with no one late: slow,
cause unknown). The console joins the two hosts' arrivals."""

from __future__ import annotations

import random

import pytest
from textual.widgets import DataTable, Static

from agentd.collectors.rank_arrivals import ArrivalTracker
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.slowdown.verdict import SlowdownJudge
from agentd.slowdown.feeds import from_snapshot
from tuiprof.analysis.slowdown import ClusterSlowdowns, slow_banner, slowdown_json
from tuiprof.client.sources import ReplaySource
from tuiprof.model import record
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.job_ops import JobOpsScreen

HOSTS = {"node-a": (0, 1, 2), "node-b": (3,)}
STEP_S, LATE_S, COLLECTIVES = 0.1, 0.03, 4
T0 = 1_795_000_000.0


def snapshots(seconds: int, late_from: int) -> list[SnapshotReceived]:
    """One snapshot per host and second; rank 3 late from second ``late_from``."""
    rng = random.Random(7)
    trackers = {rank: ArrivalTracker() for ranks in HOSTS.values() for rank in ranks}
    events, t, seq, steps = [], 0.0, 0, 0
    for second in range(seconds):
        late = LATE_S if second >= late_from else 0.0
        starts: dict[int, list[tuple[str, int, int, bool]]] = {rank: [] for rank in trackers}
        ends = []
        while t < second + 1:
            for collective in range(COLLECTIVES):
                seq += 1
                for rank in trackers:
                    delay = late if rank == 3 and collective == 0 else 0.0
                    starts[rank].append(("ab12", seq, int((T0 + t + delay + rng.uniform(0, 4e-4)) * 1e9), False))
                t += (STEP_S + late) / COLLECTIVES
            steps += 1
            ends.append(int((T0 + t) * 1e9))
        for number, (host, ranks) in enumerate(HOSTS.items()):
            snapshot = pb.HostSnapshot(hostname=host, timestamp_unix_ns=int((T0 + second + 1) * 1e9),
                                       sequence=second + 1)
            for rank in ranks:
                stats = snapshot.ranks.add(pid=100 + rank, rank=rank, job_id="4242", state=pb.RANK_STATE_RUNNING,
                                           step_count=steps, gc_pause_seconds_per_s=0.0)
                stats.arrivals.extend(trackers[rank].take(starts[rank], 4))
                stats.step_ends_unix_ns.extend(ends)
            events.append(SnapshotReceived(host=f"{host}:1779", at=T0 + second + 1 + number * 0.01,
                                           message=snapshot))
    return events


def test_each_agent_alone_names_nobody_the_console_joined_names_rank_3():
    events = snapshots(20, late_from=8)
    agents = {host: SlowdownJudge(clock=lambda: 0.0) for host in HOSTS}
    cluster, joined = ClusterState([]), ClusterSlowdowns()
    for event in events:
        agents[event.message.hostname]._clock = lambda at=event.at: at
        for verdict in agents[event.message.hostname].observe(from_snapshot(event.message)):
            assert not verdict.culprits and verdict.cause in (pb.SLOWDOWN_CAUSE_UNSPECIFIED, pb.SLOWDOWN_CAUSE_UNKNOWN), verdict
        cluster.apply(event)
        if event.host.startswith("node-b"):  # both hosts' snapshots of this second are in
            joined.observe(cluster.hosts(), cluster.now)
    (verdict,) = joined.verdicts
    assert verdict.slow and [(c.rank, c.host) for c in verdict.culprits] == [(3, "node-b")]
    assert verdict.culprits[0].cost_seconds == pytest.approx(LATE_S, rel=0.25)
    doc = slowdown_json(verdict)
    assert doc is not None and doc["hosts"] == ["node-b"] and doc["ranks"][0]["rank"] == 3
    assert doc["cost_ms"] == pytest.approx(LATE_S * 1e3, rel=0.25) and doc["cause"] == "unknown"
    banner = slow_banner(joined.verdicts)
    assert banner is not None and banner.text.startswith("SLOW job 4242: unknown — waits for rank 3 (node-b)")


def test_no_banner_and_null_json_for_a_healthy_job():
    cluster, joined = ClusterState([]), ClusterSlowdowns()
    for event in snapshots(20, late_from=99):
        cluster.apply(event)
        joined.observe(cluster.hosts(), cluster.now)
    assert [v.slow for v in joined.verdicts] == [False]
    assert slow_banner(joined.verdicts) is None and slowdown_json(joined.verdicts[0]) is None


async def test_a_replayed_recording_shows_the_verdict_in_the_banner_and_the_ops_view(tmp_path):
    path = tmp_path / "slow.ndjson"
    path.write_text("".join(record.encode(event) + "\n" for event in snapshots(20, late_from=8)))
    app = TuiprofApp(ReplaySource(list(record.read(path)), speed=0))  # everything at once: judged host by host
    async with app.run_test(size=(160, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.02)
            if app.cluster.version and app._rendered_version == app.cluster.version:
                break
        banner = app.screen.query_one("#slow-banner", Static)
        assert banner.display
        assert str(banner.render()).startswith("SLOW job 4242: unknown — waits for rank 3 (node-b)")
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, JobOpsScreen)
        assert app.screen.query_one("#slow-banner", Static).display
        assert app.screen.query_one("#ops", DataTable).row_count == 0  # no op aggregates in these snapshots
