"""What the slowdown verdict reads of one rank and one GPU: plain values, whatever the source.

The agent builds these from its snapshot's wire messages (``from_snapshot``); the
console builds the same from its model of every host it watches, so that one
verdict joins the ranks of a multi-node job. A figure the source could not give
is ``None``, and ``missing`` says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentd.proto import tuiprof_agent_pb2 as pb

RankKey = tuple[str, int]  # (host, pid)

# The per-rank rates a cause is read from, by the name the verdict uses (RankStats field names).
SIGNALS = ("gc_pause_seconds_per_s", "dataloader_wait_seconds_per_s", "run_delay_seconds_per_s",
           "cpu_throttled_seconds_per_s")


@dataclass(frozen=True)
class GpuFeed:
    """One GPU as NVML saw it in the interval, with the compute processes on it."""

    index: int
    sm_clock_hz: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    clock_event_reasons: tuple[str, ...] = ()
    processes: tuple[tuple[int, float | None], ...] = ()  # (pid, SM share %) of every compute process on it


@dataclass(frozen=True)
class RankFeed:
    """One rank process in one snapshot."""

    pid: int
    rank: int | None
    host: str
    job_id: str
    state: pb.RankState
    step_count: int
    at: float | None = None  # when its host took the snapshot (Unix s); None: when the judge is fed
    arrivals: Sequence[pb.CollectiveArrivals] = ()  # one per communicator, as ``rank_arrivals`` takes them
    step_ends: Sequence[int] = ()  # Unix ns, the steps it finished since its last snapshot
    signals: dict[str, float | None] = field(default_factory=dict)   # SIGNALS → rate, None when unavailable
    missing: dict[str, str] = field(default_factory=dict)            # SIGNALS (and "gpu") → why unavailable
    gemm_seconds: dict[str, float] = field(default_factory=dict)     # "op dtype shape" → mean GEMM latency
    comm_seconds_per_s: float | None = None  # time in NCCL kernels per second, all communicators
    gpu: GpuFeed | None = None

    @property
    def key(self) -> RankKey:
        """One rank process across hosts: pids repeat from host to host."""
        return self.host, self.pid


def from_snapshot(snapshot: pb.HostSnapshot, with_arrivals: bool = True) -> list[RankFeed]:
    """The feeds of a snapshot's ranks, each with the GPU its process is on. ``with_arrivals=False``:
    a snapshot fed before again (a host that sent nothing new), whose arrivals were judged already."""
    gpus = {p.pid: gpu for gpu in snapshot.gpus for p in gpu.processes}
    at = snapshot.timestamp_unix_ns / 1e9 if snapshot.timestamp_unix_ns else None
    return [_rank_feed(snapshot.hostname, at, rank, gpus.get(rank.pid), bool(snapshot.gpus), with_arrivals)
            for rank in snapshot.ranks]


def _rank_feed(host: str, at: float | None, rank: pb.RankStats, gpu: pb.GpuStats | None, any_gpu: bool,
               with_arrivals: bool) -> RankFeed:
    signals = {name: getattr(rank, name) if rank.HasField(name) else None for name in SIGNALS}
    missing = {name: rank.unavailable.get(name, "not reported") for name in SIGNALS if signals[name] is None}
    if gpu is None:
        missing["gpu"] = ("its process is on no GPU NVML lists" if any_gpu
                          else "no GPU on this host (or NVML unavailable)")
    gemm = {f"{g.op} {g.dtype} {g.shape}": g.latency.avg_seconds for g in rank.gemm
            if g.latency.HasField("avg_seconds") and g.timed_count_interval}
    comm = sum(n.count_per_s * n.latency.avg_seconds for n in rank.nccl if n.latency.HasField("avg_seconds"))
    return RankFeed(
        pid=rank.pid, rank=rank.rank if rank.HasField("rank") else None, host=host, job_id=rank.job_id,
        state=rank.state, step_count=rank.step_count, at=at,
        arrivals=rank.arrivals if with_arrivals else (), step_ends=rank.step_ends_unix_ns if with_arrivals else (),
        signals=signals, missing=missing, gemm_seconds=gemm,
        comm_seconds_per_s=comm if rank.nccl else None, gpu=None if gpu is None else _gpu_feed(gpu))


def _gpu_feed(gpu: pb.GpuStats) -> GpuFeed:
    def value(name: str) -> float | None:
        return getattr(gpu, name) if gpu.HasField(name) else None
    return GpuFeed(
        index=gpu.index, sm_clock_hz=value("sm_clock_hz"),
        power_watts=value("power_watts"), power_limit_watts=value("power_limit_watts"),
        temperature_celsius=value("temperature_celsius"), clock_event_reasons=tuple(gpu.clock_event_reasons),
        processes=tuple((p.pid, p.sm_percent if p.HasField("sm_percent") else None) for p in gpu.processes))
