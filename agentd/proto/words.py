"""The words users see for the contract's closed vocabularies: each enum value's ``word`` option.

A hang level, a rank's state, a trace target's state and a slowdown's cause are proto enums;
the word of a value (``"hung"``, ``"disk-sleep"``, ``"gpu_slower"``; ``""`` for UNSPECIFIED) is
what ``status --json``, /metrics label values and the screens show, read here from the proto
itself so that neither side keeps a copy of the list. Also here: which trace target states are
final, the one fact about a vocabulary both sides act on.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import EnumDescriptor, EnumValueDescriptor

from agentd.proto import tuiprof_agent_pb2 as pb

FINAL_TRACE_TARGET_STATES = frozenset({
    pb.TRACE_TARGET_STATE_WRITTEN, pb.TRACE_TARGET_STATE_BUSY, pb.TRACE_TARGET_STATE_REFUSED,
    pb.TRACE_TARGET_STATE_FAILED,
})
"""A target in one of these states moves no more: its capture is over for it."""

_WORD: Any = pb.word  # protoc's stub types a file-level extension as a plain FieldDescriptor


def value_word(value: EnumValueDescriptor) -> str:
    """The word of one enum value (its ``word`` option)."""
    word: str = value.GetOptions().Extensions[_WORD]
    return word


def words(enum: EnumDescriptor) -> dict[int, str]:
    """Every value of ``enum`` by number, as its word."""
    return {value.number: value_word(value) for value in enum.values}


def word(enum: EnumDescriptor, number: int) -> str:
    """The word of value ``number`` of ``enum``; a number this side does not know (a newer
    peer's) reads as UNSPECIFIED: ``""``."""
    value = enum.values_by_number.get(number)
    return value_word(value) if value is not None else ""


def hang_level(number: int) -> str:
    return word(pb.HangLevel.DESCRIPTOR, number)


def rank_state(number: int) -> str:
    return word(pb.RankState.DESCRIPTOR, number)


def slowdown_cause(number: int) -> str:
    return word(pb.SlowdownCause.DESCRIPTOR, number)


def trace_target_state(number: int) -> str:
    return word(pb.TraceTargetState.DESCRIPTOR, number)
