"""The one line the cluster view shows when ranks hang: how bad, since when, who, where to look.

Pure function over the hosts' latest hang verdicts (``tuiprof.model.messages.HangStatus``),
so the console and any headless command phrase a hang the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agentd.stacks import ranksets
from tuiprof.model.messages import HangLevel, HangStatus

_SEVERITY = {HangLevel.HUNG: 2, HangLevel.SUSPECT: 1}


@dataclass(frozen=True)
class HangBanner:
    level: HangLevel    # HUNG or SUSPECT
    text: str


def hang_banner(hosts: Iterable[tuple[str, HangStatus]], now_unix_ns: int) -> HangBanner | None:
    """None when no host reports a suspect or hung rank; else the worst level, summarized.

    ``hosts`` pairs a host name with its latest ``HangStatus``. The text names how many
    hosts are affected, since when (the earliest ``since`` of the worst level),
    the affected ranks folded, and the first explanation of the worst host.
    """
    affected = [(name, hang) for name, hang in hosts if hang.level in _SEVERITY]
    if not affected:
        return None
    level = max((hang.level for _, hang in affected), key=_SEVERITY.__getitem__)
    worst = [(name, hang) for name, hang in affected if hang.level == level]
    since = min(hang.since_unix_ns for _, hang in worst if hang.since_unix_ns) if any(
        hang.since_unix_ns for _, hang in worst) else None
    ranks = [v.rank for _, hang in worst for v in hang.ranks if v.level == level and isinstance(v.rank, int)]
    parts = [f"{level.upper()} on {len(worst)} host{'s' if len(worst) != 1 else ''}"]
    if since is not None:
        parts[0] += f" for {_duration((now_unix_ns - since) / 1e9)}"
    if ranks:
        parts.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {ranksets.fold_short(ranks, 40)}")
    name, hang = worst[0]
    if hang.explanation:
        parts.append(f"{name}: {hang.explanation}")
    parts.append("press s for merged stacks")
    return HangBanner(level, " — ".join(parts))


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
