"""The cluster view's `/` filter: host-name words and field comparisons such as ``util<10``.

Terms are separated by spaces and must all hold. A word without an operator
matches hosts whose name or address contains it. ``KEY OP VALUE`` compares a
summary figure (``OP`` is one of < <= > >= = !=); a host whose figure is
unavailable never matches a comparison.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from tuiprof.errors import BadInputError
from tuiprof.model.cluster import HostState
from tuiprof.model.messages import HangLevel
from tuiprof.model.values import Unavailable

FIELDS: dict[str, tuple[str, float, str]] = {
    "cpu": ("cpu_percent", 1.0, "CPU busy %"),
    "mem": ("memory_percent", 1.0, "memory used %"),
    "gpus": ("gpu_count", 1.0, "number of GPUs"),
    "util": ("gpu_util_mean", 1.0, "mean GPU utilization %"),
    "minutil": ("gpu_util_min", 1.0, "lowest GPU utilization %"),
    "sm": ("sm_active_mean", 1.0, "mean SM activity %"),
    "minsm": ("sm_active_min", 1.0, "lowest SM activity %"),
    "power": ("power_watts", 1.0, "GPU power, W"),
    "gpumem": ("gpu_memory_used_bytes", 2.0**30, "GPU memory used, GiB"),
    "busbw": ("nccl_busbw_bytes_per_s", 1e9, "NCCL bus bandwidth, GB/s"),
    "step": ("step_time_seconds", 1e-3, "step time, ms"),
}
"""Filter key → (HostSummary field, unit the typed value is in, description)."""

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "!=": operator.ne,
    "<": operator.lt, ">": operator.gt, "=": operator.eq,
}
_TERM = re.compile(r"^([a-z]+)(<=|>=|!=|<|>|=)(.+)$", re.IGNORECASE)
_OPERATOR_CHARS = set("<>=!")  # never in a host name: a term holding one is meant as a comparison
HANG_LEVELS = (HangLevel.OK, HangLevel.SUSPECT, HangLevel.HUNG)


class FilterError(BadInputError):
    """A filter expression that cannot be understood."""


@dataclass(frozen=True, slots=True)
class Comparison:
    field: str
    compare: Callable[[float, float], bool]
    value: float

    def matches(self, host: HostState) -> bool:
        if host.summary is None:
            return False
        actual = getattr(host.summary, self.field)
        return not isinstance(actual, Unavailable) and self.compare(actual, self.value)


@dataclass(frozen=True, slots=True)
class NameContains:
    text: str

    def matches(self, host: HostState) -> bool:
        return self.text in host.name.lower() or self.text in host.address.lower()


@dataclass(frozen=True, slots=True)
class HangIs:
    level: HangLevel
    negate: bool

    def matches(self, host: HostState) -> bool:
        level = host.summary.hang_level if host.summary else HangLevel.UNSPECIFIED
        return (level == self.level) != self.negate


Term = Comparison | NameContains | HangIs


def _parse_term(text: str) -> Term:
    match = _TERM.match(text)
    if match is None:
        if _OPERATOR_CHARS & set(text):
            raise FilterError(f"{text!r}: not a comparison; write FIELD OP NUMBER, e.g. util<10")
        return NameContains(text.lower())
    key, op, value = match.groups()
    key = key.lower()
    if key == "hang":
        if op not in ("=", "!="):
            raise FilterError(f"{text!r}: hang compares with = or != (e.g. hang=hung)")
        if value.lower() not in HANG_LEVELS:
            raise FilterError(f"{text!r}: unknown hang level {value!r}; levels: {', '.join(HANG_LEVELS)}")
        return HangIs(HangLevel(value.lower()), negate=op == "!=")
    if key not in FIELDS:
        known = ", ".join([*FIELDS, "hang"])
        raise FilterError(f"{text!r}: unknown field {key!r}; known fields: {known}")
    try:
        number = float(value)
    except ValueError:
        raise FilterError(f"{text!r}: {value!r} is not a number") from None
    field, unit, _ = FIELDS[key]
    return Comparison(field, _OPERATORS[op], number * unit)


@dataclass(frozen=True, slots=True)
class HostFilter:
    text: str
    terms: tuple[Term, ...]

    @classmethod
    def parse(cls, text: str) -> HostFilter:
        return cls(text.strip(), tuple(_parse_term(t) for t in text.split()))

    def matches(self, host: HostState) -> bool:
        return all(term.matches(host) for term in self.terms)


def help_text() -> str:
    """One line per field, for the help screen."""
    lines = [f"  {key:<8} {description}" for key, (_, _, description) in FIELDS.items()]
    lines.append("  hang     hang level: hang=hung, hang=suspect, hang!=ok")
    return "\n".join(lines)
