"""Two real jobs on one host, each with a rank 0: the NCCL/GEMM view keeps their processes apart.

Each job is the stand-in GPU workload of the native tests under `tuiprof run` (the real
hook library over stand-in cuBLAS/NCCL), read by a real agentd.
"""

from __future__ import annotations

import asyncio

import pytest
from native.conftest import standins  # noqa: F401  (the stand-in GPU libraries, built with gcc)
from native.support import stand_in_rank, watch_snapshot
from testkit.agents import running_agent

from agentd.proto import tuiprof_agent_pb2 as pb
from console.conftest import open_job_ops
from tuiprof.analysis.job_ops import job_ops
from tuiprof.client.sources import ReplaySource
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp

pytestmark = pytest.mark.slow

GEMM_SIGNATURES = 5  # (op, dtype) pairs the stand-in workload calls, one shape each
COLLECTIVES = 4


def stand_in_job(standins, job: str):  # noqa: F811
    """The stand-in workload as rank 0 of ``job``, stopped at READY with its ops done and its segment live."""
    return stand_in_rank(standins, {"RANK": "0", "WORLD_SIZE": "1", "TUIPROF_JOB_ID": job})


def timed_ops(snapshot: pb.HostSnapshot, pids: set[int]) -> bool:
    """Both processes read, with the latency of the ops they ran before READY."""
    ranks = [r for r in snapshot.ranks if r.pid in pids]
    return len(ranks) == len(pids) and all(r.gemm and r.gemm[0].latency.HasField("p50_seconds") for r in ranks)


def test_two_jobs_rank_0_on_one_host_are_two_processes_in_the_ops_view(standins, tmp_path):  # noqa: F811
    # The agent starts after both jobs ran their ops, so its first reading of each covers them all.
    with (stand_in_job(standins, "job-a") as a, stand_in_job(standins, "job-b") as b,
          running_agent(tmp_path) as agent):
        snapshot = asyncio.run(watch_snapshot(agent, lambda s: timed_ops(s, {a.pid, b.pid})))
    cluster = ClusterState([])
    cluster.apply(SnapshotReceived("n1", 1.0, snapshot))
    rows = [r for r in job_ops(cluster) if r.pid in (a.pid, b.pid)]
    per_process = {(r.job, r.pid): sum(1 for x in rows if x.pid == r.pid) for r in rows}
    assert per_process == {("job-a", a.pid): GEMM_SIGNATURES + COLLECTIVES,
                           ("job-b", b.pid): GEMM_SIGNATURES + COLLECTIVES}
    assert {r.rank for r in rows} == {"rank 0"}  # one per job: no pid needed to tell them apart
    assert len({r.key for r in rows}) == len(rows)
    # One rank per job: nothing to compare with, so no straggler verdict mixes the two jobs.
    assert all(r.verdict is None for r in rows)
    gemm = [r for r in rows if r.kind == "gemm"]
    # Every call of the interval was read, so its min and max are calls' own times; the first
    # call of each GEMM was timed (stand-in CUDA events) and kept apart.
    assert all(r.min_seconds.exact and r.max_seconds.exact for r in gemm)
    assert all(isinstance(r.first_call_seconds, float) and r.first_call_seconds > 0 for r in gemm)
    assert all(r.first_call_seconds is None for r in rows if r.kind == "nccl")
    # The view shows every rank of the host; keep only these two jobs' (other tests' ranks may be live).
    theirs = [r for r in snapshot.ranks if r.pid in (a.pid, b.pid)]
    del snapshot.ranks[:]
    snapshot.ranks.extend(theirs)
    asyncio.run(_shown_apart(snapshot, len(rows), a.pid, b.pid))


async def _shown_apart(snapshot: pb.HostSnapshot, row_count: int, pid_a: int, pid_b: int) -> None:
    app = TuiprofApp(ReplaySource([SnapshotReceived("n1", 1.0, snapshot)], speed=0))
    async with app.run_test(size=(200, 50)) as pilot:
        table = await open_job_ops(app, pilot)
        assert table.row_count == row_count
        job = [str(c.label) for c in table.columns.values()].index("Job")
        jobs = [str(table.get_row_at(i)[job]) for i in range(table.row_count)]
        assert jobs.count("job-a") == jobs.count("job-b") == row_count // 2
        detail = app.screen.query_one("#ops-detail")
        assert str(detail.render()).startswith(f"n1 rank 0 pid {pid_a} job job-a")
        for _ in range(row_count // 2):
            await pilot.press("j")
        assert str(detail.render()).startswith(f"n1 rank 0 pid {pid_b} job job-b")
