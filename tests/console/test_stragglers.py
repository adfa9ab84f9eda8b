"""Straggler verdicts: far from the median by ratio and by MADs; small groups get none."""

from __future__ import annotations

from tuiprof.analysis.stragglers import OpSample, judge


def samples(latencies: list[float], op: str = "AllReduce") -> list[OpSample]:
    return [OpSample("h", f"rank {i}", "nccl", op, x) for i, x in enumerate(latencies)]


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
