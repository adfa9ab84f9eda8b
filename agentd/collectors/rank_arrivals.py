"""When a rank started its collectives: the slowdown verdict's raw material (``RankStats.arrivals``).

Two sources, one per kind of process group. NCCL's collectives come from the hook
library's event ring: an event's start is the GPU's start of the collective's
kernel, i.e. when this rank's GPU reached it (its peers' kernels wait inside it for
the last one). Other backends' (gloo) come from the Flight Recorder entries the
startup hook publishes (``recent``): when this rank enqueued the collective, which
for a CPU backend is when it reached it.

Every rank of a job must report the same collectives for the verdict to join them on
(communicator, sequence number), and what the console joins must stay within reach at 1024
ranks (bench/slowdown/scale.py). A rank reports every collective while its job is small:
up to ``ARRIVALS_PER_JOB`` an interval over the job's world size, per communicator (at
least ``MAX_ARRIVALS_PER_COMM``). Past that it keeps whole blocks of ``BLOCK`` consecutive
sequence numbers, those whose block number hashes to a multiple of a power of two chosen
to stay within the budget. Whole blocks, because a late rank holds up one collective of
its step (the first) and the others start together after it: a block spans whole steps,
so what it holds up per collective is what the job loses per collective. Hashed, because
a step has a fixed number of collectives that a period could match. Every rank draws the
same blocks: peers whose intervals hold a few more collectives may pick the next power of
two, and what the larger keeps the smaller keeps too.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

MAX_ARRIVALS_PER_COMM = 16
ARRIVALS_PER_JOB = 16384
BLOCK = 16

_MASK64 = 2**64 - 1

Arrival = tuple[str, int, int, bool]  # (communicator, sequence number, start in Unix ns, enqueued: see the proto)


def from_nccl_events(events: Iterable) -> list[Arrival]:
    """Arrivals of the hook library's finished NCCL events (``tuiprof_native.segment.Event``)."""
    return [(f"{e.comm_hash:x}", e.op_seq, e.start_ns, False) for e in events if e.kind == "nccl" and e.start_ns]


def from_flight_recent(recent: Iterable[dict]) -> list[Arrival]:
    """Arrivals of the Flight Recorder's newest entries, as the startup hook publishes them."""
    return [(printable(f"pg{r['pg']}"), int(r["seq"]), int(r["enqueued_ns"]), True) for r in recent]


class ArrivalTracker:
    """One rank's arrivals not yet reported: each collective once, however often a source repeats it."""

    def __init__(self) -> None:
        self._reported: dict[str, int] = {}  # communicator → the newest sequence number already taken

    def take(self, arrivals: Iterable[Arrival], world_size: int | None) -> list[pb.CollectiveArrivals]:
        """The arrivals newer than those taken before, each communicator's within the budget of a job of
        ``world_size`` ranks (unknown: the smallest budget)."""
        budget = max(MAX_ARRIVALS_PER_COMM, ARRIVALS_PER_JOB // world_size) if world_size else MAX_ARRIVALS_PER_COMM
        new: dict[str, dict[int, int]] = {}
        enqueued: dict[str, bool] = {}
        for comm, seq, start_ns, by_enqueue in arrivals:
            if seq > self._reported.get(comm, -1):
                new.setdefault(comm, {})[seq] = start_ns
                enqueued[comm] = by_enqueue
        sample = []
        for comm, starts in sorted(new.items()):
            newest = max(starts)
            every = blocks_every(len(starts), budget)
            kept = [seq for seq in sorted(starts) if every == 1 or _mixed(seq // BLOCK) % every == 0]
            sample.append(pb.CollectiveArrivals(comm=comm, sequence=kept, start_unix_ns=[starts[seq] for seq in kept],
                                                enqueued=enqueued[comm]))
            self._reported[comm] = newest
        return sample


def blocks_every(count: int, budget: int) -> int:
    """1 when ``count`` collectives fit the budget, else the smallest power of two of blocks to keep one
    in, so that on average at most ``budget`` are kept."""
    every = 1
    while count / every > budget:
        every *= 2
    return every


def _mixed(seq: int) -> int:
    """``seq`` hashed (splitmix64's finalizer): the same on every rank, with no period a step could match."""
    z = (seq + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)
