"""The ranks collector's per-owner budget of ops (issue 24 item 4), in-process over real segments.

Root's own ``sleep`` processes with segments of 511 GEMM ops each (tests/testkit/op_segments.py)
in a private folder on /dev/shm; the budget set low so that three segments cross it: the first
rank is reported whole, the second in part, the third not read at all. When a rank before them
goes, the one that was not read is read again as a baseline first (no figures that interval:
its slots have no previous reading), then reported with rates.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from agentd.collectors import ranks
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.segment_forge import recorded_segment
from testkit.op_segments import MAX_OPS_PER_SEGMENT, check_ops, with_ops, write_claim
from tuiprof_native import segment

BUDGET = MAX_OPS_PER_SEGMENT + 89

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the collector checks segment owners as root")


@pytest.fixture
def three_segments() -> Iterator[tuple[pathlib.Path, list[subprocess.Popen]]]:
    prefix = with_ops(recorded_segment(), MAX_OPS_PER_SEGMENT)
    check_ops(prefix, MAX_OPS_PER_SEGMENT)
    folder = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    time.sleep(0.05)  # started before their segments
    for proc in sorted(sleepers, key=lambda p: p.pid):
        write_claim(folder / f"{segment.SEGMENT_PREFIX}{os.getuid()}-{proc.pid}", prefix, proc.pid)
    yield folder, sorted(sleepers, key=lambda p: p.pid)
    for proc in sleepers:
        proc.kill()
        proc.wait(10)
    shutil.rmtree(folder)


def collected(collector: RanksCollector) -> pb.HostSnapshot:
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return snapshot


def test_an_owners_ops_past_the_budget_are_left_out_counted_and_read_again_as_a_baseline(three_segments,
                                                                                         monkeypatch):
    folder, (first, second, third) = three_segments
    monkeypatch.setattr(ranks, "MAX_OPS_PER_OWNER", BUDGET)
    collector = RanksCollector(1.0, directory=str(folder))
    try:
        snapshot = collected(collector)
        reported = {rank.pid: rank for rank in snapshot.ranks}
        assert [len(reported[p.pid].gemm) for p in (first, second, third)] == [MAX_OPS_PER_SEGMENT, 89, 0]
        assert "ops" not in reported[first.pid].unavailable  # whole: its figures are not the budget's business
        assert reported[first.pid].unavailable["gemm_tflops"] == "no timed GEMM finished in the interval"
        assert reported[second.pid].unavailable["ops"].startswith(f"{MAX_OPS_PER_SEGMENT - 89} of this rank's ops")
        assert reported[third.pid].unavailable["ops"].startswith(f"{MAX_OPS_PER_SEGMENT} of this rank's ops")
        assert "per-owner budget" in reported[third.pid].unavailable["gemm_tflops"]
        [dropped] = snapshot.rank_ops_dropped
        assert (dropped.uid, dropped.ops) == (os.getuid(), 2 * MAX_OPS_PER_SEGMENT - 89)
        assert f"published {3 * MAX_OPS_PER_SEGMENT} ops" in dropped.reason
        assert collector._ranks[str(folder / f"tuiprof-{os.getuid()}-{third.pid}")].slots is None  # not read

        (folder / f"tuiprof-{os.getuid()}-{first.pid}").unlink()  # the first rank's file goes: budget frees up
        snapshot = collected(collector)
        reported = {rank.pid: rank for rank in snapshot.ranks}
        assert len(reported[second.pid].gemm) == MAX_OPS_PER_SEGMENT
        assert not reported[third.pid].gemm and reported[third.pid].unavailable["gemm"] == ranks._OPS_BASELINE
        [dropped] = snapshot.rank_ops_dropped  # the baseline's share was read; the rest still left out
        assert dropped.ops == MAX_OPS_PER_SEGMENT - 89

        snapshot = collected(collector)
        third_stats = next(rank for rank in snapshot.ranks if rank.pid == third.pid)
        assert len(third_stats.gemm) == 89 and "gemm" not in third_stats.unavailable
        assert all(op.count_per_s == 0 for op in third_stats.gemm)  # nothing called since its baseline
    finally:
        collector.close()


def test_flight_recorder_groups_count_against_the_budget_and_are_not_parsed_past_it(three_segments, monkeypatch):
    folder, (first, second, third) = three_segments
    groups, active = 200, 3
    flight = {"groups": [{"id": str(n), "last_enqueued": 5, "last_completed": 5} for n in range(groups)],
              "active": [{"op": "allreduce", "pg": n, "seq": 6, "enqueued_ns": time.time_ns()} for n in range(active)]}
    for proc in (first, second):
        (folder / f"tuiprof-{os.getuid()}-{proc.pid}{segment.FLIGHT_SUFFIX}").write_text(json.dumps(flight))
    monkeypatch.setattr(ranks, "MAX_OPS_PER_OWNER", BUDGET)
    collector = RanksCollector(1.0, directory=str(folder))
    try:
        snapshot = collected(collector)
    finally:
        collector.close()
    reported = {rank.pid: rank for rank in snapshot.ranks}
    assert len(reported[first.pid].gemm) == MAX_OPS_PER_SEGMENT and len(reported[first.pid].process_groups) == 89
    assert not [op for op in reported[first.pid].inflight if op.kind == "fr"]
    assert reported[first.pid].unavailable["ops"].startswith(f"{groups - 89 + active} of this rank's ops")
    assert not reported[second.pid].process_groups
    assert reported[second.pid].unavailable["process_groups"].startswith("not read: the ranks of uid")
    [dropped] = snapshot.rank_ops_dropped  # the second's groups were never parsed: not counted
    assert dropped.ops == groups - 89 + active + 2 * MAX_OPS_PER_SEGMENT
