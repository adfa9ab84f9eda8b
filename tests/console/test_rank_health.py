"""The hook's health, Flight Recorder progress, where a rank runs and its timed Python functions, as the
host view's ranks tab and `status --json` show them."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from agentd.proto import tuiprof_agent_pb2 as pb
from console.conftest import open_host_tab
from tuiprof.analysis.rank_health import flight_recorder, hook_reasons, rank_notes
from tuiprof.client.sources import ReplaySource
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived
from tuiprof.model.export import cluster_document
from tuiprof.model.messages import HostSnapshot
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.host import RANK_COLUMNS, HostScreen

INERT = "no shared memory segment: /dev/shm is full (ENOSPC)"


def two_ranks() -> pb.HostSnapshot:
    """Rank 0: GEMMs without CUDA events, a full ring, Flight Recorder on, in step 0 of SLURM job 42;
    rank 1: hook inert, in a Docker container of its own in that job."""
    message = pb.HostSnapshot(hostname="n1", sequence=2)
    for name in ("host", "ranks"):
        message.collectors.add(name=name, available=True)
    message.cpu.idle_percent = 50.0
    timed = message.ranks.add(pid=100, rank=0, state=pb.RANK_STATE_RUNNING, step_count=5)
    timed.hook.nccl_plugin = True
    timed.hook.gemm_untimed_total, timed.hook.dropped_records_total = 640, 12
    timed.gemm.add(op="cublasGemmEx", dtype="fp32", count_total=640)
    timed.process_groups.add(id="0", last_enqueued=40, last_completed=38)
    timed.process_groups.add(id="1", last_enqueued=7, last_completed=7)
    timed.container.CopyFrom(pb.Container(runtime="slurm", slurm_job_id="42", slurm_step="0"))
    timed.functions.add(name="__main__:train_step", calls_total=5, seconds_total=2.5, max_seconds=0.75,
                        calls_per_s=2.0, seconds_per_s=0.5)
    timed.functions.add(name="torch:cuda.synchronize", calls_total=50, seconds_total=4.0, max_seconds=0.25,
                        calls_per_s=20.0, seconds_per_s=0.125)
    inert = message.ranks.add(pid=101, rank=1, state=pb.RANK_STATE_RUNNING, step_count=5, pid_in_container=1)
    inert.hook.inactive_reason = INERT
    inert.container.CopyFrom(pb.Container(runtime="docker", id="5dace3de0735" + "0" * 52, slurm_job_id="42",
                                          slurm_step="0", own_mount_namespace=True))
    return message


def test_hook_health_becomes_reasons() -> None:
    snapshot = HostSnapshot.from_proto(two_ranks())
    timed, inert = snapshot.ranks
    assert hook_reasons(timed.hook) == ["640 GEMMs counted but not timed: no CUDA events",
                                        "12 records dropped: ring full"]
    assert flight_recorder(timed) == "Flight Recorder: pg 0 enqueued 40 completed 38 (2 pending) · " \
                                     "pg 1 enqueued 7 completed 7"
    assert rank_notes(inert) == [f"telemetry off: {INERT}"]  # nothing else: the hook counted nothing
    healthy = HostSnapshot.from_proto(pb.HostSnapshot(ranks=[pb.RankStats(pid=5)])).ranks[0]
    assert rank_notes(healthy) == []


def test_a_chained_nccl_profiler_plugin_is_said_first() -> None:
    chained = pb.RankStats(pid=5, hook=pb.HookHealth(
        nccl_plugin=True, nccl_profiler_api=5, nccl_profiler_chain="chains to /opt/inspector.so (ncclProfiler_v5)",
        dropped_records_total=1))
    rank = HostSnapshot.from_proto(pb.HostSnapshot(ranks=[chained])).ranks[0]
    assert hook_reasons(rank.hook) == ["NCCL profiler plugin chains to /opt/inspector.so (ncclProfiler_v5)",
                                       "1 records dropped: ring full"]
    plain = HostSnapshot.from_proto(pb.HostSnapshot(ranks=[pb.RankStats(pid=6, hook=pb.HookHealth(
        nccl_plugin=True, nccl_profiler_api=6))])).ranks[0]
    assert rank_notes(plain) == []  # the API NCCL took is in status --json, not a note


def test_status_json_has_the_hook_the_process_groups_and_where_ranks_run() -> None:
    cluster = ClusterState(["n1"])
    cluster.apply(SnapshotReceived("n1", 1.0, two_ranks()))
    ranks = cluster_document(cluster)["hosts"][0]["ranks"]
    assert ranks[0]["hook"]["dropped_records_total"] == 12 and ranks[0]["hook"]["cuda_timing"] is False
    assert ranks[0]["process_groups"] == [{"id": "0", "last_enqueued": 40, "last_completed": 38},
                                          {"id": "1", "last_enqueued": 7, "last_completed": 7}]
    assert ranks[1]["hook"]["inactive_reason"] == INERT
    assert ranks[0]["functions"][0] == {"name": "__main__:train_step", "calls_total": 5, "seconds_total": 2.5,
                                        "max_seconds": 0.75, "calls_per_s": 2.0, "seconds_per_s": 0.5}
    assert (ranks[1]["pid_in_container"], ranks[1]["container"]["slurm_job_id"], ranks[1]["container"]["runtime"]) \
        == (1, "42", "docker")


async def test_ranks_tab_explains_the_hook_and_an_inert_rank_says_why_where_its_figures_would_be() -> None:
    app = TuiprofApp(ReplaySource([SnapshotReceived("n1", 1.0, two_ranks())], speed=0))
    async with app.run_test(size=(250, 40)) as pilot:
        screen = await open_host_tab(app, pilot, "ranks")
        assert isinstance(screen, HostScreen)
        detail = str(screen.query_one("#host-detail", Static).render())
        assert "rank 0: 640 GEMMs counted but not timed: no CUDA events" in detail
        assert "rank 0: 12 records dropped: ring full" in detail
        assert "rank 0: Flight Recorder: pg 0 enqueued 40 completed 38 (2 pending)" in detail
        table = screen.query_one("#ranks-table", DataTable)
        column = {str(column.label): index for index, column in enumerate(table.columns.values())}
        assert list(column) == [column.label for column in RANK_COLUMNS]  # wide enough for every column
        assert str(table.get_row_at(1)[column["GEMM"]]) == f"telemetry off: {INERT}"
        assert [str(table.get_row_at(row)[column["Where"]]) for row in (0, 1)] == [
            "job 42.0", "docker 5dace3de0735 · job 42.0, pid 1"]
        assert [str(table.get_row_at(row)[column["Top function"]]) for row in (0, 1)] == [
            "train_step 500 ms/s", "none"]  # the most time per second, not the most in all
        await pilot.press("j")
        assert str(screen.query_one("#host-detail", Static).render()).startswith(f"rank 1: telemetry off: {INERT}")
        ops = screen.query_one("#rank-ops-table", DataTable)
        assert str(ops.get_row_at(0)[0]) == f"telemetry off: {INERT}"


def two_jobs_one_rank_number() -> pb.HostSnapshot:
    """Two jobs on one host, each with a rank 0: only job b's rank has ops."""
    message = pb.HostSnapshot(hostname="n1", sequence=2)
    for name in ("host", "ranks"):
        message.collectors.add(name=name, available=True)
    message.ranks.add(pid=18916, rank=0, job_id="a", state=pb.RANK_STATE_RUNNING, step_count=3)
    other = message.ranks.add(pid=18918, rank=0, job_id="b", state=pb.RANK_STATE_RUNNING, step_count=9)
    other.gemm.add(op="cublasLtMatmul", dtype="bf16", count_total=90)
    return message


async def test_two_jobs_with_the_same_rank_number_get_a_row_each_and_their_own_ops() -> None:
    app = TuiprofApp(ReplaySource([SnapshotReceived("n1", 1.0, two_jobs_one_rank_number())], speed=0))
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_host_tab(app, pilot, "ranks")
        table = screen.query_one("#ranks-table", DataTable)
        rows = [[str(cell) for cell in table.get_row_at(i)[:3]] for i in range(table.row_count)]
        assert rows == [["rank 0 (pid 18916)", "18916", "a"], ["rank 0 (pid 18918)", "18918", "b"]]
        title = screen.query_one("#rank-ops-title")
        assert str(title.render()) == "GEMM and NCCL ops of rank 0 (pid 18916, job a)"
        await pilot.press("j")
        assert str(title.render()) == "GEMM and NCCL ops of rank 0 (pid 18918, job b)"
        ops = screen.query_one("#rank-ops-table", DataTable)
        assert "cublasLtMatmul" in [str(c) for c in ops.get_row_at(0)]
