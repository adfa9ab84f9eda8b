"""The NCCL/GEMM view's figures from issue 13: min/max exact or a bucket edge, a GEMM's first call apart."""

from __future__ import annotations

from agentd.proto import tuiprof_agent_pb2 as pb
from console.conftest import open_job_ops
from tuiprof.client.sources import ReplaySource
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp


def one_rank() -> pb.HostSnapshot:
    message = pb.HostSnapshot(hostname="n1", sequence=2)
    message.collectors.add(name="ranks", available=True)
    rank = message.ranks.add(pid=4242, rank=0, job_id="j", state=pb.RANK_STATE_RUNNING)
    rank.hook.gemm_timed_first_calls, rank.hook.gemm_sample_every = 100, 16
    timed = rank.gemm.add(op="cublasGemmEx", dtype="bf16", shape="b=1 m=8 n=8 k=8", count_total=9,
                          first_call_seconds=0.25, timed_count_interval=7)
    timed.latency.CopyFrom(pb.LatencyStats(avg_seconds=2e-3, min_seconds=1e-3, max_seconds=4e-3, p50_seconds=2e-3,
                                           p99_seconds=4e-3, min_exact=True, max_exact=False))
    untimed_first = rank.gemm.add(op="cublasLtMatmul", dtype="fp32", shape="b=1 m=8 n=8 k=8", count_total=3)
    untimed_first.latency.CopyFrom(pb.LatencyStats(avg_seconds=3e-3, min_seconds=2e-3, max_seconds=3e-3,
                                                   p50_seconds=3e-3, min_exact=False, max_exact=True))
    collective = rank.nccl.add(op="AllReduce", dtype="bf16", count_total=4)
    collective.latency.CopyFrom(pb.LatencyStats(avg_seconds=5e-3, p50_seconds=5e-3, min_exact=True, max_exact=True))
    return message


async def test_bounds_are_marked_and_the_first_call_stands_apart() -> None:
    app = TuiprofApp(ReplaySource([SnapshotReceived("n1", 1.0, one_rank())], speed=0))
    async with app.run_test(size=(200, 50)) as pilot:
        table = await open_job_ops(app, pilot)
        labels = [str(c.label) for c in table.columns.values()]
        picked = [labels.index(c) for c in ("Op", "Min", "Max", "First call", "Timed")]
        rows = [[str(table.get_row_at(i)[c]) for c in picked] for i in range(table.row_count)]
        assert rows == [
            ["cublasGemmEx bf16 b=1 m=8 n=8 k=8", "1.00 ms", "≤4.00 ms", "250 ms", "1 in 16"],
            ["cublasLtMatmul fp32 b=1 m=8 n=8 k=8", "≥2.00 ms", "3.00 ms", "n/a", "1 in 16"],
            ["AllReduce bf16", "n/a", "n/a", "", ""],  # no min/max sent; collectives: no first call, all timed
        ]
        detail = app.screen.query_one("#ops-detail")
        assert ("GEMM timing: every call of a shape timed up to 100, then 1 in 16; 7 timed in this interval"
                in str(detail.render()))
        await pilot.press("j")
        assert "first call: n/a (the first call was not timed)" in str(detail.render())
        summary = str(app.screen.query_one("#ops-summary").render())
        assert "≥ min, ≤ max: a histogram bucket's edge" in summary and "first call" in summary
