"""GEMM replay: the shapes a rank ran, timed again alone, beside their speed in the job (xpu-timer's
matmul replay). Pure: which rank, which shapes, how fast each was in the job, and the reading of
alone against in the job; ``tuiprof.commands.gemm_timing`` does the timing with PyTorch.

What the hook records of a GEMM (``tuiprof_native/hook/gemm_hooks.c``, ``lt_hooks.c``) is its
interposer's name, the dtype of A (``tp_cuda_dtype_name``) and cuBLAS's b, m, n, k as called:
the exact shape, never a bucket (every distinct shape has a slot of its own). Two slots are not a
shape: ``other``, where a segment puts every shape past its slot table (``slot_for`` in
``segment_writer.c``), and a ``cublasLtMatmul`` whose descriptors could not be read (dtype
``unknown``, shape all zeros). Transposes are not recorded (``cublasGemmEx``'s ``transa``/``transb``
are not kept; cuBLASLt's ``TRANSA`` only decides which dimension is k), so the replay runs each
shape with neither operand transposed, and says so.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from tuiprof.errors import BadInputError
from tuiprof.model.events import HostEvent, HostUnreachable, SnapshotReceived

SHAPE = re.compile(r"b=(\d+) m=(\d+) n=(\d+) k=(\d+)")
"""``GemmOpStats.shape`` as ``agentd.collectors.rank_rates.gemm_stats`` writes it."""

OVERFLOW_OP = "other"
"""The op name of a segment's overflow slot: the GEMMs of every shape past its slot table, summed."""

UNREAD_DTYPE = "unknown"
"""The dtype of a ``cublasLtMatmul`` whose descriptors the hook could not read (its shape is all zeros)."""

TORCH_DTYPES = {
    "fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16",
    "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2", "int8": "int8",
    "c64": "complex64", "c128": "complex128",
}
"""The hook's dtype names (``tp_cuda_dtype_name``) → the names of torch's dtypes. The hook's other
names (``int32``, ``cudaN``) are no A type PyTorch hands cuBLAS: not replayed."""

FASTER_ALONE = 1.25
"""Alone at least this many times the job's TFLOPS: faster alone; at most its inverse: slower alone; in
between: as fast. A short replay runs at the GPU's boost clocks: up to 15 % above a job that had the
GPU to itself, on an H200 (bench/gpu/gemm_replay_gpu.md); contention cost the job's GEMMs about 2x there."""

LAYOUT = ("layout replayed: cuBLAS's C[m,n] = A[m,k]·B[k,n] with neither operand transposed "
          "(the hook does not record transposes)")
EXACT_SHAPES = "shapes: the exact b, m, n, k of the job's calls (the hook does not bucket shapes)"
IN_JOB = ("in the job: the shape's achieved TFLOPS over the agent's intervals (its calls' FLOPs over their "
          "kernel time, from each interval's GemmOpStats.tflops weighted by its calls)")
FP32_NOTE = ("fp32 is replayed in full FP32 (PyTorch's default, TF32 off); the hook does not record the "
             "compute type, and a job that allows TF32 runs fp32 GEMMs faster than this")


class NoSuchRankError(BadInputError):
    """The rank asked for is not among those the agents (or the recording) reported."""


class NoGemmError(BadInputError):
    """The rank chosen ran no GEMM the hook could see."""


@dataclass(frozen=True)
class GemmShape:
    """cuBLAS's dimensions of one GEMM call: ``b`` batches of C[m,n] = A[m,k]·B[k,n]."""

    b: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.b * self.m * self.n * self.k

    def __str__(self) -> str:
        return f"b={self.b} m={self.m} n={self.n} k={self.k}"


def parse_shape(text: str) -> GemmShape:
    """``b=1 m=4096 n=4096 k=4096`` as a shape; ValueError for anything else."""
    match = SHAPE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a GEMM shape: {text!r} (expected 'b=B m=M n=N k=K')")
    return GemmShape(*(int(group) for group in match.groups()))


@dataclass(frozen=True)
class RankChoice:
    """Which rank to replay: ``--rank``, ``--pid``, ``--job``; none given means the only one there is."""

    rank: int | None = None
    pid: int | None = None
    job: str | None = None


@dataclass(frozen=True)
class ChosenRank:
    host: str
    pid: int
    rank: int | None
    job_id: str

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a process without RANK"
        job = f", job {self.job_id}" if self.job_id else ""
        return f"{who} (pid {self.pid} on {self.host}{job})"


def _ranks_seen(events: Iterable[HostEvent]) -> dict[tuple[str, int], ChosenRank]:
    """Every rank process the snapshots name, by (host, pid); its latest rank number and job."""
    seen: dict[tuple[str, int], ChosenRank] = {}
    for event in events:
        if isinstance(event, SnapshotReceived):
            for rank in event.message.ranks:
                seen[event.host, rank.pid] = ChosenRank(event.host, rank.pid,
                                                        rank.rank if rank.HasField("rank") else None, rank.job_id)
    return seen


def _listed(ranks: Iterable[ChosenRank], most: int = 8) -> str:
    named = sorted(ranks, key=lambda r: (r.job_id, -1 if r.rank is None else r.rank, r.host, r.pid))
    text = "; ".join(str(rank) for rank in named[:most])
    return text + (f"; and {len(named) - most} more" if len(named) > most else "")


def _unreachable(events: Iterable[HostEvent]) -> str:
    down = {event.host: event.error for event in events if isinstance(event, HostUnreachable)}
    return "".join(f"; {host} unreachable: {error}" for host, error in down.items())


def choose_rank(events: list[HostEvent], choice: RankChoice) -> ChosenRank:
    """The one rank process ``choice`` names among the snapshots of ``events``; NoSuchRankError, naming
    the ranks there are (and the hosts that did not answer), when it names none or several."""
    seen = _ranks_seen(events)
    candidates = [r for r in seen.values()
                  if (choice.rank is None or r.rank == choice.rank) and (choice.pid is None or r.pid == choice.pid)
                  and (choice.job is None or r.job_id == choice.job)]
    down = _unreachable(events)
    if not seen:
        raise NoSuchRankError(f"no rank in the snapshots{down}: start the job with `tuiprof run`")
    asked = " ".join(part for part in (
        f"rank {choice.rank}" if choice.rank is not None else "", f"pid {choice.pid}" if choice.pid is not None else "",
        f"job {choice.job}" if choice.job is not None else "") if part)
    if not candidates:
        raise NoSuchRankError(f"no {asked or 'rank'} among the ranks seen: {_listed(seen.values())}{down}")
    if len(candidates) > 1:
        missing = [option for option, wanted in (
            ("--rank N", choice.rank is None),
            ("--job ID", choice.job is None and len({r.job_id for r in candidates}) > 1)) if wanted]
        if choice.pid is not None:
            hint = "name the one HOST it runs on"
        elif missing:
            hint = f"choose one with {' and '.join(missing)}, or --pid PID"
        else:
            hint = "choose one with --pid PID (and its HOST)"
        matching = f"{asked} matches {len(candidates)} processes" if asked else f"{len(candidates)} rank processes here"
        raise NoSuchRankError(f"{matching}: {_listed(candidates)}; {hint}")
    return candidates[0]


@dataclass
class JobGemm:
    """One GEMM signature (interposer, dtype, shape) of the chosen rank, as the job ran it."""

    op: str
    dtype: str
    shape: str
    intervals: list[tuple[float, float]] = field(default_factory=list)  # (TFLOPS, calls) of each with a figure
    calls: int = 0  # the rank's calls of it so far (count_total of the latest report)

    @property
    def in_job_tflops(self) -> float | None:
        """FLOPs over kernel time across the intervals: their TFLOPS' harmonic mean weighted by their calls
        (each interval's kernel time is its calls' FLOPs over its TFLOPS), so an interval whose calls waited
        on another process weighs what it cost; equal weights where no interval counted a call."""
        if not self.intervals:
            return None
        weights = [calls for _, calls in self.intervals]
        if sum(weights) == 0:
            weights = [1.0] * len(self.intervals)
        return sum(weights) / sum(w / tflops for w, (tflops, _) in zip(weights, self.intervals, strict=True))


def job_gemms(events: list[HostEvent], chosen: ChosenRank) -> list[JobGemm]:
    """The chosen rank's GEMMs over every snapshot of it, most called first; NoGemmError when it has none
    (with the agent's reason where it gave one)."""
    gemms: dict[tuple[str, str, str], JobGemm] = {}
    reason = ""
    for event in events:
        if not isinstance(event, SnapshotReceived) or event.host != chosen.host:
            continue
        rank = next((r for r in event.message.ranks if r.pid == chosen.pid), None)
        if rank is None:
            continue
        reason = rank.unavailable.get("gemm", reason)
        seconds = rank.interval_seconds if rank.HasField("interval_seconds") else 1.0  # weights: relative only
        for op in rank.gemm:
            gemm = gemms.setdefault((op.op, op.dtype, op.shape), JobGemm(op.op, op.dtype, op.shape))
            gemm.calls = max(gemm.calls, op.count_total)
            if op.HasField("tflops") and op.tflops > 0:
                gemm.intervals.append((op.tflops, op.count_per_s * seconds))
    if not gemms:
        why = f": {reason}" if reason else ": the hook saw no cuBLAS GEMM call (does the job run on a GPU?)"
        raise NoGemmError(f"{chosen} recorded no GEMM{why}")
    return sorted(gemms.values(), key=lambda g: -g.calls)


def not_replayable(gemm: JobGemm) -> str | None:
    """Why this signature cannot be replayed as one shape (None: it can)."""
    if gemm.op == OVERFLOW_OP:
        return "the segment's overflow slot: every shape past its slot table, summed; not one shape"
    if gemm.dtype == UNREAD_DTYPE:
        return "the hook could not read this call's cuBLASLt descriptors: its dtype and shape are unknown"
    if gemm.dtype not in TORCH_DTYPES:
        return f"dtype {gemm.dtype!r} is no GEMM input type PyTorch runs"
    try:
        shape = parse_shape(gemm.shape)
    except ValueError as exc:
        return str(exc)
    if shape.flops == 0:
        return "a GEMM of no FLOPs (a dimension is 0): nothing to time"
    return None


@dataclass(frozen=True)
class AloneFigure:
    """One shape timed alone: ``calls`` timed calls (after the warm-up), their median time."""

    flops: int
    calls: int
    median_seconds: float
    how: str  # the torch call that ran it, e.g. "torch.mm"

    @property
    def tflops(self) -> float:
        return self.flops / self.median_seconds / 1e12


def alone_figure(shape: GemmShape, seconds: list[float], how: str) -> AloneFigure:
    """The median of the timed calls' durations; ValueError without any call that took time."""
    positive = [s for s in seconds if s > 0]
    if not positive:
        raise ValueError(f"no timed call of {shape} took measurable time ({len(seconds)} calls)")
    return AloneFigure(shape.flops, len(seconds), statistics.median(positive), how)


@dataclass(frozen=True)
class NotReplayed:
    reason: str


@dataclass(frozen=True)
class ReplayRow:
    gemm: JobGemm
    alone: AloneFigure | NotReplayed


def reading(alone: float, in_job: float | None) -> str:
    """What alone against in the job says about this shape, in one line."""
    if in_job is None:
        return "no in-job figure to compare with: no timed call of this shape finished while the agent watched"
    ratio = alone / in_job
    if ratio >= FASTER_ALONE:
        return f"fast alone ({ratio:.2f}x the job's) -> contention or the job's surroundings"
    if ratio <= 1 / FASTER_ALONE:
        return (f"slower alone ({ratio:.2f}x the job's) -> the device replayed on is slower than the job's, "
                "or busy: is something else running on it?")
    return (f"as fast alone as in the job ({ratio:.2f}x) -> not contention: the GPU's own speed (a slow GPU is "
            "slow alone too: compare its peers)")


def tflops_text(value: float) -> str:
    """Three significant figures: a CPU's 0.00123 TFLOP/s and a GPU's 612 TFLOP/s alike."""
    return f"{value:.0f} TFLOP/s" if value >= 100 else f"{value:.3g} TFLOP/s"


def render(chosen: ChosenRank, device: str, warmup_seconds: float, rows: list[ReplayRow]) -> list[str]:
    """The report: what was replayed and how, then per signature its figures and the reading."""
    lines = [f"GEMM replay of {chosen} on {device}: per shape {warmup_seconds:g} s of warm-up calls, then the timed ones",
             EXACT_SHAPES, LAYOUT, IN_JOB]
    if any(row.gemm.dtype == "fp32" for row in rows):
        lines.append(FP32_NOTE)
    if device.startswith("cpu"):
        lines.append("replayed on the CPU: alone against in the job says nothing of the GPU here")
    for row in rows:
        g = row.gemm
        in_job = g.in_job_tflops
        lines.append("")
        lines.append(f"{g.op} {g.dtype} {g.shape}  ({g.calls} calls in the job)")
        intervals = len(g.intervals)
        lines.append("  in the job: " + (f"{tflops_text(in_job)} (over {intervals} agent interval"
                                         f"{'s' if intervals > 1 else ''})" if in_job is not None else "n/a"))
        if isinstance(row.alone, NotReplayed):
            lines.append(f"  alone:      not replayed: {row.alone.reason}")
            continue
        alone = row.alone
        lines.append(f"  alone:      {tflops_text(alone.tflops)} (median of {alone.calls} calls, {alone.how})")
        lines.append(f"  reading:    {reading(alone.tflops, in_job)}")
    return lines

