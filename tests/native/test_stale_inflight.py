"""An in-flight NCCL entry the hook never saw finish, while later collectives of the same
communicator finished (issue 29: rank 0's AllReduce #59 pending past #240 made a healthy rank
"hung"): the ranks collector leaves it out and counts it in the hook's health, once."""

from __future__ import annotations

import types

from agentd.collectors import ranks
from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof_native import segment


def nccl_event(seq: int, comm: int = 0xC0FFEE) -> segment.Event:
    return segment.Event(index=seq, kind="nccl", op="AllReduce", dtype="bf16", rank=0, start_ns=seq * 1000,
                         end_ns=seq * 1000 + 500, bytes=1024, flops=0, op_seq=seq, comm_hash=comm,
                         b=0, m=0, n=0, k=0)


def inflight(seq: int, comm: str = "c0ffee") -> pb.InflightOp:
    return pb.InflightOp(kind="nccl", op="AllReduce", comm_hash=comm, sequence=seq, age_seconds=40.0)


def test_a_pending_collective_behind_a_finished_one_is_left_out_and_counted_once():
    rank = types.SimpleNamespace(finished={}, stale=set())
    stats = pb.RankStats(inflight=[inflight(59), inflight(7, comm="beef"),
                                   pb.InflightOp(kind="gemm", op="cublasLtMatmul", stream=3, sequence=1)])
    ranks._drop_stale_inflight(rank, stats, [nccl_event(239), nccl_event(240)])
    assert [(op.kind, op.comm_hash, op.sequence) for op in stats.inflight] == [("nccl", "beef", 7), ("gemm", "", 1)]
    assert stats.hook.stale_inflight_total == 1
    again = pb.RankStats(inflight=[inflight(59), inflight(241)])  # the next interval: no new events
    ranks._drop_stale_inflight(rank, again, [])
    assert [op.sequence for op in again.inflight] == [241]  # newer than any finished: really in flight
    assert again.hook.stale_inflight_total == 1


def test_the_oldest_unfinished_collective_is_kept():
    rank = types.SimpleNamespace(finished={}, stale=set())
    stats = pb.RankStats(inflight=[inflight(241)])
    ranks._drop_stale_inflight(rank, stats, [nccl_event(240)])
    assert [op.sequence for op in stats.inflight] == [241] and stats.hook.stale_inflight_total == 0
