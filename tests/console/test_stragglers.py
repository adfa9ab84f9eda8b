"""Straggler verdicts: far from the median by ratio and by MADs; small groups get none."""

from __future__ import annotations

from tuiprof.analysis.stragglers import OpSample, judge
from tuiprof.model.values import Unavailable


def samples(latencies: list[float], op: str = "AllReduce") -> list[OpSample]:
    return [OpSample("h", "job", f"rank {i}", "nccl", op, x) for i, x in enumerate(latencies)]


def test_one_slow_rank_is_flagged_first() -> None:
    verdicts = judge(samples([4.8e-3, 4.9e-3, 4.85e-3, 13.0e-3, 4.82e-3]))
    assert [v.sample.rank for v in verdicts if v.straggler] == ["rank 3"]
    assert verdicts[0].sample.rank == "rank 3"
    assert round(verdicts[0].ratio, 2) == round(13.0e-3 / 4.85e-3, 2)


def test_uniform_ranks_and_noise_are_not_stragglers() -> None:
    assert not any(v.straggler for v in judge(samples([1.0, 1.0, 1.0, 1.0])))
    # 1.6x the median but within the group's spread: not far from the others
    assert not any(v.straggler for v in judge(samples([1.0, 0.5, 1.6, 1.5, 0.6])))


def test_groups_are_per_op_and_small_groups_get_no_verdict() -> None:
    mixed = samples([1.0, 1.0, 1.0], "AllReduce") + samples([9.0, 9.0], "AllGather")
    verdicts = judge(mixed)
    assert {v.sample.op for v in verdicts} == {"AllReduce"}
    assert not any(v.straggler for v in verdicts)


def test_job_ops_over_the_fixture_cluster_flags_only_the_slow_rank() -> None:
    from console.recordings import GPU_FIXTURE
    from tuiprof.analysis.job_ops import job_ops
    from tuiprof.model import record
    from tuiprof.model.cluster import ClusterState

    cluster = ClusterState([])
    for event in record.read(GPU_FIXTURE):
        cluster.apply(event)
    rows = job_ops(cluster)
    stragglers = [r for r in rows if r.verdict and r.verdict.straggler]
    assert [(r.host, r.rank, r.kind) for r in stragglers] == [("gpu-node-02", "rank 13", "nccl")]
    assert rows[0] is stragglers[0]
    assert len(rows) == 4 * 8 * 2  # every host's last snapshot (gpu-node-04's is its last before going down)
    idle = [r for r in rows if r.host == "gpu-node-03" and r.kind == "gemm"]
    assert idle and all(isinstance(r.throughput, Unavailable) for r in idle)  # idle: absent, not 0
