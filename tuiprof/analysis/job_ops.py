"""Per-rank GEMM and NCCL op rows across every host of the job, with straggler verdicts.

Read straight from each host's last wire message, not the model: building the
model costs ~1 ms per host of 8 GPUs and 8 ranks (0.5 ms for its ranks alone)
against ~0.18 ms for this whole view's rows, and with a thousand hosts streaming
that difference is most of a core while the view is open.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks.verdicts import who
from tuiprof.analysis.stragglers import OpSample, Verdict, judge
from tuiprof.model.cluster import ClusterState
from tuiprof.model.summary import reading
from tuiprof.model.values import Reading, Unavailable


@dataclass(frozen=True, slots=True)
class Extreme:
    """An interval's lowest or highest latency, and whether a call really took it.

    Not exact: the call fell in a histogram bucket, and this is the bucket's edge
    (clamped to the op's lifetime extreme), so the real minimum is at least this
    and the real maximum at most this.
    """

    seconds: Reading
    exact: bool


@dataclass(frozen=True, slots=True)
class GemmTiming:
    """The hook's GEMM timing sampling: every call of a shape up to ``first_calls``, then one in
    ``sample_every`` (the shape's period: fixed, or chosen from its kernel time when ``adaptive``);
    ``timed_in_interval`` of the interval's calls were timed. Counts are exact."""

    first_calls: int
    sample_every: int
    timed_in_interval: int
    adaptive: bool = False

    @property
    def rate(self) -> str:
        """``every call`` or ``1 in 16``; ``n/a`` when the hook did not say (an older hook)."""
        if self.sample_every == 0:
            return "n/a"
        return "every call" if self.sample_every == 1 else f"1 in {self.sample_every}"

    def describe(self) -> str:
        if self.sample_every == 0:
            return "GEMM timing sampling: not reported by this rank's hook library"
        rule = ("every call timed" if self.sample_every == 1
                else f"every call of a shape timed up to {self.first_calls}, then 1 in {self.sample_every}"
                + (" (chosen for this shape from its kernel time)" if self.adaptive else ""))
        return f"GEMM timing: {rule}; {self.timed_in_interval} timed in this interval"


@dataclass(frozen=True, slots=True)
class OpRow:
    host: str
    job: str
    pid: int
    rank: str
    """``rank 3`` (``pid N`` when the rank is unknown)."""
    kind: str
    op: str
    count_per_s: float
    p50_seconds: Reading
    p99_seconds: Reading
    min_seconds: Extreme
    max_seconds: Extreme
    first_call_seconds: Reading | None
    """A GEMM slot's first call, which includes lazy module loading; None for collectives."""
    timing: GemmTiming | None
    """Which of a GEMM's calls are timed (its p50, p99, min, max and TFLOP/s come from those); None for collectives."""
    throughput: Reading
    """NCCL bus bandwidth (bytes/s) or GEMM TFLOP/s."""
    verdict: Verdict | None

    @property
    def key(self) -> str:
        """Unique per row: two jobs' rank 0 on one host are two processes, two rows."""
        return f"{self.host}/{self.job}/{self.pid}/{self.kind}/{self.op}"


FIRST_CALL_NOT_TIMED = "the first call was not timed"


def typical_latency(latency: pb.LatencyStats) -> Reading:
    """The p50 when the agent has a histogram, else the mean."""
    p50 = reading(latency, "p50_seconds")
    return p50 if not isinstance(p50, Unavailable) else reading(latency, "avg_seconds")


def _signature(op: pb.GemmOpStats | pb.NcclOpStats) -> str:
    if isinstance(op, pb.GemmOpStats):
        parts = (op.op, op.dtype, op.shape)
    else:
        parts = (op.op, op.dtype, f"comm {op.comm_hash}" if op.comm_hash else "")
    return " ".join(part for part in parts if part)


def _natural(label: str) -> tuple[str, int]:
    """``rank 10`` after ``rank 9``."""
    word, _, number = label.rpartition(" ")
    return (word, int(number)) if number.isdigit() else (label, -1)


def _timing(rank: pb.RankStats, op: pb.GemmOpStats | pb.NcclOpStats) -> GemmTiming | None:
    if isinstance(op, pb.NcclOpStats):
        return None
    adaptive = rank.hook.gemm_sample_max > 0
    # the shape's own period once one of its calls was sampled; before, an adaptive hook timed them all
    period = op.sample_every or (1 if adaptive else rank.hook.gemm_sample_every)
    return GemmTiming(rank.hook.gemm_timed_first_calls, period, op.timed_count_interval, adaptive)


def _first_call(op: pb.GemmOpStats | pb.NcclOpStats) -> Reading | None:
    if isinstance(op, pb.NcclOpStats):
        return None
    return reading(op, "first_call_seconds", FIRST_CALL_NOT_TIMED)


def _rank_labels(cluster: ClusterState) -> dict[tuple[str, int], str]:
    """``rank 0`` per (host, pid); ``rank 0 (pid N)`` where processes of one job on one host share a label."""
    labels: dict[tuple[str, int], str] = {}
    for state in cluster.hosts():
        if state.message is None:
            continue
        ranks = state.message.ranks
        shared = Counter((rank.job_id, who(rank)) for rank in ranks)
        for rank in ranks:
            label = who(rank)
            labels[state.address, rank.pid] = label if shared[rank.job_id, label] == 1 else f"{label} (pid {rank.pid})"
    return labels


def job_ops(cluster: ClusterState) -> list[OpRow]:
    """Every (host, process, op) row; stragglers first, then by host, job and rank.

    A process is its pid on its host, not its rank number: two jobs on one host
    each have a rank 0. Stragglers are judged within each job.
    """
    raw: list[tuple[str, pb.RankStats, str, str, pb.GemmOpStats | pb.NcclOpStats]] = []
    for state in cluster.hosts():
        if state.message is None:
            continue
        for rank in state.message.ranks:
            raw.extend((state.address, rank, "gemm", _signature(op), op) for op in rank.gemm)
            raw.extend((state.address, rank, "nccl", _signature(op), op) for op in rank.nccl)
    labels = _rank_labels(cluster)
    samples = [
        OpSample(host, rank.job_id, labels[host, rank.pid], kind, signature, typical)
        if not isinstance(typical := typical_latency(op.latency), Unavailable) else None
        for host, rank, kind, signature, op in raw
    ]
    verdicts = {id(v.sample): v for v in judge(s for s in samples if s is not None)}
    rows = []
    for (host, rank, kind, signature, op), sample in zip(raw, samples, strict=True):
        latency = op.latency
        rows.append(OpRow(
            host=host, job=rank.job_id, pid=rank.pid, rank=labels[host, rank.pid], kind=kind, op=signature,
            count_per_s=op.count_per_s,
            p50_seconds=typical_latency(latency), p99_seconds=reading(latency, "p99_seconds"),
            min_seconds=Extreme(reading(latency, "min_seconds"), latency.min_exact),
            max_seconds=Extreme(reading(latency, "max_seconds"), latency.max_exact),
            first_call_seconds=_first_call(op), timing=_timing(rank, op),
            throughput=reading(op, "busbw_bytes_per_s" if kind == "nccl" else "tflops"),
            verdict=verdicts.get(id(sample)) if sample is not None else None,
        ))
    rows.sort(key=lambda r: (not (r.verdict and r.verdict.straggler), r.host, r.job, _natural(r.rank), r.pid,
                             r.kind, r.op))
    return rows
