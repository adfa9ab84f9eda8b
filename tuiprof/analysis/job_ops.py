"""Per-rank GEMM and NCCL op rows across every host of the job, with straggler verdicts."""

from __future__ import annotations

from dataclasses import dataclass

from tuiprof.analysis.stragglers import OpSample, Verdict, judge
from tuiprof.model.cluster import ClusterState
from tuiprof.model.snapshot import GemmOp, Latency, NcclOp
from tuiprof.model.values import Reading, Unavailable


@dataclass(frozen=True, slots=True)
class OpRow:
    host: str
    rank: str
    kind: str
    op: str
    count_per_s: float
    p50_seconds: Reading
    p99_seconds: Reading
    throughput: Reading
    """NCCL bus bandwidth (bytes/s) or GEMM TFLOP/s."""
    verdict: Verdict | None


def typical_latency(latency: Latency) -> Reading:
    """The p50 when the agent has a histogram, else the mean."""
    if not isinstance(latency.p50_seconds, Unavailable):
        return latency.p50_seconds
    return latency.avg_seconds


def _signature(kind: str, op: GemmOp | NcclOp) -> str:
    if isinstance(op, GemmOp):
        return " ".join(part for part in (op.op, op.dtype, op.shape) if part)
    return " ".join(part for part in (op.op, op.dtype, f"comm {op.comm_hash}" if op.comm_hash else "") if part)


def _natural(label: str) -> tuple[str, int]:
    """``rank 10`` after ``rank 9``."""
    word, _, number = label.rpartition(" ")
    return (word, int(number)) if number.isdigit() else (label, -1)


def job_ops(cluster: ClusterState) -> list[OpRow]:
    """Every (host, rank, op) row; stragglers first, then by host and rank."""
    raw: list[tuple[str, str, str, str, GemmOp | NcclOp]] = []
    for state in cluster.hosts():
        if state.snapshot is None:
            continue
        for rank in state.snapshot.ranks:
            for kind, ops in (("gemm", rank.gemm), ("nccl", rank.nccl)):
                for op in ops:
                    raw.append((state.address, rank.label, kind, _signature(kind, op), op))
    samples = {
        id(op): OpSample(host, rank, kind, signature, latency)
        for host, rank, kind, signature, op in raw
        if not isinstance(latency := typical_latency(op.latency), Unavailable)
    }
    verdicts = {id(v.sample): v for v in judge(samples.values())}
    rows = []
    for host, rank, kind, signature, op in raw:
        sample = samples.get(id(op))
        rows.append(OpRow(
            host=host, rank=rank, kind=kind, op=signature, count_per_s=op.count_per_s,
            p50_seconds=typical_latency(op.latency), p99_seconds=op.latency.p99_seconds,
            throughput=op.busbw_bytes_per_s if isinstance(op, NcclOp) else op.tflops,
            verdict=verdicts.get(id(sample)) if sample else None,
        ))
    rows.sort(key=lambda r: (not (r.verdict and r.verdict.straggler), r.host, _natural(r.rank), r.kind, r.op))
    return rows
