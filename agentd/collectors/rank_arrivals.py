"""When a rank started its collectives: the slowdown verdict's raw material (``RankStats.arrivals``).

Two sources, one per kind of process group. NCCL's collectives come from the hook
library's event ring: an event's start is the GPU's start of the collective's
kernel, i.e. when this rank's GPU reached it (its peers' kernels wait inside it for
the last one). Other backends' (gloo) come from the Flight Recorder entries the
startup hook publishes (``recent``): when this rank enqueued the collective, which
for a CPU backend is when it reached it.

Every rank of a job must report the same collectives for the verdict to join them on
(communicator, sequence number), and a snapshot must stay small at 1024 ranks: per
communicator and interval, only the sequence numbers whose hash is a multiple of
``sample_every`` are kept, the smallest power of two that leaves about
``MAX_ARRIVALS_PER_COMM``. Hashed, not the multiples themselves: a step has a fixed
number of collectives, and keeping every second one could keep only the ones a late
rank never holds up. Peers whose intervals hold a few more or fewer collectives may
pick the next power of two; what the larger one keeps the smaller one keeps too, and
the verdict weighs each joined collective by the largest ``sample_every`` its ranks
reported.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

MAX_ARRIVALS_PER_COMM = 16

_MASK64 = 2**64 - 1

Arrival = tuple[str, int, int]  # (communicator, sequence number, start in Unix ns)


def from_nccl_events(events: Iterable) -> list[Arrival]:
    """Arrivals of the hook library's finished NCCL events (``tuiprof_native.segment.Event``)."""
    return [(f"{e.comm_hash:x}", e.op_seq, e.start_ns) for e in events if e.kind == "nccl" and e.start_ns]


def from_flight_recent(recent: Iterable[dict]) -> list[Arrival]:
    """Arrivals of the Flight Recorder's newest entries, as the startup hook publishes them."""
    return [(printable(f"pg{r['pg']}"), int(r["seq"]), int(r["enqueued_ns"])) for r in recent]


class ArrivalTracker:
    """One rank's arrivals not yet reported: each collective once, however often a source repeats it."""

    def __init__(self) -> None:
        self._reported: dict[str, int] = {}  # communicator → the newest sequence number already taken
        self._newest: dict[str, tuple[int, int]] = {}  # communicator → (sequence, start) of the newest taken

    def take(self, arrivals: Iterable[Arrival]) -> list[pb.CollectiveArrivals]:
        """The sample of ``arrivals`` newer than those taken before (see the module's docstring)."""
        new: dict[str, dict[int, int]] = {}
        for comm, seq, start_ns in arrivals:
            if seq > self._reported.get(comm, -1):
                new.setdefault(comm, {})[seq] = start_ns
        sample = []
        for comm, starts in sorted(new.items()):
            newest = max(starts)
            every = sample_every(len(starts))
            before = dict([self._newest[comm]]) if comm in self._newest else {}
            kept = [seq for seq in sorted(starts) if _mixed(seq) % every == 0]
            sample.append(pb.CollectiveArrivals(
                comm=comm, sample_every=every, sequence=kept, start_unix_ns=[starts[seq] for seq in kept],
                previous_start_unix_ns=[starts.get(seq - 1, before.get(seq - 1, 0)) for seq in kept]))
            self._reported[comm], self._newest[comm] = newest, (newest, starts[newest])
        return sample


def _mixed(seq: int) -> int:
    """``seq`` hashed (splitmix64's finalizer): the same on every rank, with no period a step could match."""
    z = (seq + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_every(count: int) -> int:
    """The smallest power of two that keeps at most MAX_ARRIVALS_PER_COMM of ``count`` consecutive collectives."""
    every = 1
    while count / every > MAX_ARRIVALS_PER_COMM:
        every *= 2
    return every
