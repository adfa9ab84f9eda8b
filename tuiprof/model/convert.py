"""Generic conversion of the frozen snapshot dataclasses from protobuf and to JSON.

A dataclass mirrors a proto message by field name; ``NESTED`` (a class variable)
names the fields that hold other dataclasses, ``ENUMS`` the fields that hold a closed
vocabulary's ``StrEnum`` (a value the console does not know, a newer agent's, reads as
UNSPECIFIED). Optional proto scalars become a
number or an Unavailable whose reason comes from the message's ``unavailable`` map.
In JSON an unavailable reading is ``null`` and its reason sits in the object's
``"unavailable"`` map (present only when some reading is null), as in the proto.
Every string and reason goes through ``agentd.text.printable`` on the way in: text other
users wrote (op names, process names, frames) reaches the screen escaped, whatever the
agent that sent it did.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from agentd.proto.words import words
from agentd.text import printable
from tuiprof.model.values import NOT_REPORTED, Unavailable

D = TypeVar("D")
E = TypeVar("E", bound=StrEnum)


def from_word(enum: type[E], word: str) -> E:
    """A closed vocabulary's word received outside the proto (a Prometheus label value) as its
    member; UNSPECIFIED (``""``) when it names none."""
    try:
        return enum(word)
    except ValueError:
        return enum("")


def _nested(cls: type) -> dict[str, type]:
    return getattr(cls, "NESTED", {})


def _enums(cls: type) -> dict[str, type[StrEnum]]:
    return getattr(cls, "ENUMS", {})


_REPEATED, _OPTIONAL, _PLAIN, _TEXT, _ENUM = range(5)


@functools.cache
def _plan(cls: type, descriptor: Descriptor) -> tuple[tuple[str, int, Any], ...]:
    """How to fill each field of ``cls`` but the nested messages from a message of type
    ``descriptor`` (computed once)."""
    nested = _nested(cls)
    steps: list[tuple[str, int, Any]] = []
    for field in dataclasses.fields(cls):
        proto_field = descriptor.fields_by_name[field.name]
        if field.name in nested:
            continue  # NestedOnFirstRead converts it when it is read
        if field.name in _enums(cls) and proto_field.enum_type is not None:
            members = {number: _enums(cls)[field.name](word) for number, word in words(proto_field.enum_type).items()}
            steps.append((field.name, _ENUM, members))
        elif proto_field.is_repeated:
            steps.append((field.name, _REPEATED, ()))
        elif proto_field.has_presence:
            steps.append((field.name, _OPTIONAL, None))
        elif proto_field.type == FieldDescriptor.TYPE_STRING:
            steps.append((field.name, _TEXT, ""))
        else:
            steps.append((field.name, _PLAIN, proto_field.default_value))
    return tuple(steps)


def from_proto(
    cls: type[D],
    msg: Message,
    default_reason: str = NOT_REPORTED,
    section_reasons: dict[str, str] | None = None,
) -> D:
    """Build ``cls`` from ``msg``; absent readings get their reason or ``default_reason``.

    ``section_reasons`` gives the default reason for a nested field's readings
    (e.g. the reason its collector could not run). The console converts every
    snapshot of every host, so this reads all set fields with one ``ListFields``
    call and follows a per-class plan instead of probing field by field. Fields
    holding other messages are converted when first read (``NestedOnFirstRead``):
    a screen reads a few sections of a snapshot, and a rank's ops are most of it.
    """
    present = {descriptor.name: value for descriptor, value in msg.ListFields()}
    reasons: dict[str, str] = {key: printable(reason) for key, reason in present.get("unavailable", {}).items()}
    if section_reasons:
        reasons = {**section_reasons, **reasons}
    obj = object.__new__(cls)
    for name, kind, extra in _plan(cast(type, cls), msg.DESCRIPTOR):
        if kind == _OPTIONAL:
            value = present.get(name, _ABSENT)
            value = Unavailable(reasons.get(name, default_reason)) if value is _ABSENT else value
        elif kind == _TEXT:  # another user's text may be in any string: shown escaped, never acted on
            value = printable(present.get(name, extra), keep_lines=True)  # a traceback keeps its lines
        elif kind == _PLAIN:
            value = present.get(name, extra)
        elif kind == _ENUM:
            value = extra.get(present.get(name, 0), extra[0])
        else:
            value = tuple(present.get(name, extra))
        object.__setattr__(obj, name, value)
    if _nested(cls):
        object.__setattr__(obj, "_source", (msg, reasons, default_reason))
    return obj


class NestedOnFirstRead:
    """Base of the generated classes whose fields hold other messages: such a field of an
    instance made by ``from_proto`` is converted the first time it is read, then kept."""

    __slots__ = ("_source",)
    NESTED: ClassVar[dict[str, type]]

    def __getattr__(self, name: str) -> Any:
        # Python calls this only for an attribute not set: a nested field not read yet.
        try:
            msg, reasons, default_reason = object.__getattribute__(self, "_source")
        except AttributeError:  # built by its constructor: every field is set
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None
        if name not in self.NESTED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = _nested_value(self.NESTED[name], msg, name, reasons, default_reason)
        object.__setattr__(self, name, value)
        return value


def _nested_value(cls: type, msg: Message, name: str, reasons: dict[str, str], default_reason: str) -> Any:
    """Field ``name`` of ``msg``, a message or a repeated message, as ``cls`` (a tuple of them)."""
    reason = reasons.get(name, default_reason)
    field = getattr(msg, name)
    if not msg.DESCRIPTOR.fields_by_name[name].is_repeated:
        return from_proto(cls, field, reason)
    per_item = _item_reasons(reasons, name) if reasons else {}
    return tuple(from_proto(cls, item, reason, per_item.get(_item_key(item)) if per_item else None)
                 for item in field)


_ABSENT = object()


def _item_reasons(reasons: dict[str, str], name: str) -> dict[str, dict[str, str]]:
    """The reasons a message gives for one item of its repeated field ``name``, per item.

    They are keyed ``name[<item key>].<field>`` (the agent's ``processes[4242].sm_percent``),
    the item key being the value of the item's first field.
    """
    prefix = f"{name}["
    per_item: dict[str, dict[str, str]] = {}
    for key, reason in reasons.items():
        if key.startswith(prefix):
            item, _, field = key[len(prefix):].partition("].")
            per_item.setdefault(item, {})[field] = reason
    return per_item


def _item_key(item: Message) -> str:
    return str(getattr(item, item.DESCRIPTOR.fields[0].name))


def to_json(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of a snapshot dataclass (unavailable readings as null + reason)."""
    out: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, Unavailable):
            out[field.name] = None
            unavailable[field.name] = value.reason
        elif dataclasses.is_dataclass(value):
            out[field.name] = to_json(value)
        elif isinstance(value, tuple):
            out[field.name] = [to_json(v) if dataclasses.is_dataclass(v) else v for v in value]
        else:
            out[field.name] = value
    if unavailable:
        out["unavailable"] = unavailable
    return out
