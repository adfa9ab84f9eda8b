"""Which rank is behind, read from collective sequence numbers.

Each rank's hook library reports the collectives it has launched and not yet
finished (communicator, op, sequence number, age). Comparing the highest
launched sequence number per communicator across its members names the rank
that never joined ("never launched all_reduce #1042") and separates it from
ranks that joined and wait. The sentences carry no rank number so that ranks
with the same finding can be folded together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agentd.stacks import ranksets


@dataclass(frozen=True)
class Inflight:
    op: str
    comm: str
    sequence: int
    age_seconds: float


@dataclass(frozen=True)
class RankCollectives:
    """What one rank has in flight, and the communicators it belongs to."""

    rank: int
    inflight: tuple[Inflight, ...] = ()
    comms: frozenset[str] = field(default_factory=frozenset)

    def member_of(self) -> set[str]:
        return set(self.comms) | {op.comm for op in self.inflight}


def short_comm(comm: str) -> str:
    return comm if len(comm) <= 6 else f"{comm[:4]}…"


def findings(ranks: Iterable[RankCollectives]) -> dict[int, str]:
    """Rank → what its collectives say, for ranks that are behind or stuck in one.

    Per communicator the frontier is the highest sequence number any member has
    launched. A member without it in flight and not past it never launched it;
    a member with it in flight is waiting in it (and, when every member is, the
    collective itself is stuck: network, NCCL or a GPU, not a missing rank).
    """
    return {rank: text for rank, (text, _) in _assess(ranks).items()}


def behind(ranks: Iterable[RankCollectives]) -> int:
    """The ranks (a mask) that never launched, or lag behind, a collective other members launched."""
    return ranksets.mask_of(rank for rank, (_, late) in _assess(ranks).items() if late)


def _assess(ranks: Iterable[RankCollectives]) -> dict[int, tuple[str, bool]]:
    """Rank → (finding, whether it is behind the frontier); the first communicator with a finding wins."""
    ranks = list(ranks)
    by_comm: dict[str, list[RankCollectives]] = {}
    for rank in ranks:
        for comm in rank.member_of():
            by_comm.setdefault(comm, []).append(rank)
    result: dict[int, tuple[str, bool]] = {}
    for comm, members in sorted(by_comm.items()):
        latest = {m.rank: _latest(m, comm) for m in members}
        launched = [op for op in latest.values() if op is not None]
        if not launched:
            continue
        front = max(launched, key=lambda op: op.sequence)
        joined = ranksets.mask_of(r for r, op in latest.items() if op and op.sequence >= front.sequence)
        for member, op in sorted(latest.items()):
            text = _finding(op, front, joined, member, len(members))
            if text and member not in result:
                result[member] = (text, not joined >> member & 1)
    return result


def _latest(rank: RankCollectives, comm: str) -> Inflight | None:
    ops = [op for op in rank.inflight if op.comm == comm]
    return max(ops, key=lambda op: op.sequence) if ops else None


def _finding(op: Inflight | None, front: Inflight, joined: int, rank: int, members: int) -> str | None:
    where = f"{front.op} #{front.sequence} on comm {short_comm(front.comm)}"
    others = joined & ~(1 << rank)
    who = f"ranks {ranksets.fold(others)}" if others.bit_count() > 1 else f"rank {ranksets.fold(others)}"
    if op is None:
        return f"never launched {where} ({who} launched it)"
    if op.sequence < front.sequence:
        return f"is at {op.op} #{op.sequence}, behind {where} ({who} launched it)"
    if joined.bit_count() == members:
        return f"launched {where} {op.age_seconds:.0f} s ago and it has not finished on any member"
    return None
