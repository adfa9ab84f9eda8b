"""Rank sets folded as text (``0-3,5-7``), the way STAT prints task lists.

Inside the analysis layer a rank set is a Python ``int`` bit mask (bit ``r`` set
= rank ``r`` is in the set): union is one ``|`` and a 4096-rank set is 512
bytes, which keeps merging thousands of stacks cheap. These helpers convert
between masks, sorted rank lists and the folded text users read and type.

A process without a rank number (a job started without ``RANK``) still has a
place in a merged tree: the console gives it a bit above every rank number of
the merge and a name, ``pid 4242`` (``unranked``: bit → name), and the folded
text lists it by that name after the ranks: ``0-3,pid 4242``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class RankSetError(ValueError):
    """A folded rank set that cannot be parsed (names the bad part)."""


def mask_of(ranks: Iterable[int]) -> int:
    """The bit mask of ``ranks``; ranks must be non-negative."""
    mask = 0
    for rank in ranks:
        if rank < 0:
            raise RankSetError(f"rank {rank} is negative; ranks are 0 or more")
        mask |= 1 << rank
    return mask


def ranks_of(mask: int) -> list[int]:
    """The sorted ranks whose bits are set in ``mask``."""
    ranks = []
    while mask:
        low = mask & -mask
        ranks.append(low.bit_length() - 1)
        mask ^= low
    return ranks


def fold(ranks: Iterable[int] | int, unranked: Mapping[int, str] | None = None) -> str:
    """``[0, 1, 2, 3, 5]`` (or its mask) as ``"0-3,5"``; the empty set is ``""``. The processes
    without a rank number among them (bits of ``unranked``) follow by name: ``0-3,5,pid 4242``."""
    mask = ranks if isinstance(ranks, int) else mask_of(ranks)
    numbered, names = split_unranked(mask, unranked)
    return ",".join([_span(start, end) for start, end in runs(numbered)] + names)


def split_unranked(mask: int, unranked: Mapping[int, str] | None) -> tuple[int, list[str]]:
    """``mask`` without the bits of ``unranked``, and the names of those it had (in bit order)."""
    if not unranked:
        return mask, []
    names = [name for bit, name in sorted(unranked.items()) if mask >> bit & 1]
    return mask & ~mask_of(unranked), names


def who(mask: int, unranked: Mapping[int, str] | None = None, limit: int = 80) -> str:
    """A set of processes in a sentence: ``rank 3``, ``ranks 0-2``, ``pid 4242``, ``ranks 0-2 and pid 4242``."""
    numbered, names = split_unranked(mask, unranked)
    parts = [f"{'rank' if numbered.bit_count() == 1 else 'ranks'} {fold_short(numbered, limit)}"] if numbered else []
    if names:
        parts.append(", ".join(names))
    return " and ".join(parts)


def runs(mask: int) -> list[tuple[int, int]]:
    """The maximal runs of set bits as (first, last) ranks, lowest first.

    Walks runs, not bits: the complement of a 4096-rank set with one hole is
    two steps, which keeps "ranks that did not reach this frame" cheap.
    """
    out = []
    while mask:
        low = mask & -mask
        start = low.bit_length() - 1
        carried = mask + low          # the run's bits clear; the bit after it sets
        after = (carried & -carried).bit_length() - 1
        out.append((start, after - 1))
        mask &= ~((1 << after) - 1)
    return out


def _span(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


def parse(text: str) -> list[int]:
    """``"0-3,5"`` as ``[0, 1, 2, 3, 5]`` (sorted, no duplicates)."""
    ranks: set[int] = set()
    if not text.strip():
        return []
    for part in text.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise RankSetError(
                f"bad rank range {part.strip()!r} in {text!r}: expected N or N-M, e.g. 0-3,5"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise RankSetError(f"bad rank range {part.strip()!r}: {end} is below {start}")
        ranks.update(range(start, end + 1))
    return sorted(ranks)


def fold_short(ranks: Iterable[int] | int, limit: int = 60, unranked: Mapping[int, str] | None = None) -> str:
    """``fold`` cut to about ``limit`` characters at a comma, ending in ``…`` when cut (for screens)."""
    text = fold(ranks, unranked)
    if len(text) <= limit:
        return text
    cut = text.rfind(",", 0, limit)
    if cut <= 0:  # the first range alone is longer than the limit: keep it whole
        cut = text.find(",")
    return text if cut < 0 else text[:cut] + ",…"
