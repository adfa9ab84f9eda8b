"""Generic conversion of the frozen snapshot dataclasses from protobuf and to/from JSON.

A dataclass mirrors a proto message by field name; ``NESTED`` (a class variable)
names the fields that hold other dataclasses. Optional proto scalars become a
number or an Unavailable whose reason comes from the message's ``unavailable`` map.
In JSON an unavailable reading is ``null`` and its reason sits in the object's
``"unavailable"`` map (present only when some reading is null), as in the proto.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message

from tuiprof.model.values import NOT_REPORTED, Unavailable

D = TypeVar("D")


def _nested(cls: type) -> dict[str, type]:
    return getattr(cls, "NESTED", {})


def from_proto(
    cls: type[D],
    msg: Message,
    default_reason: str = NOT_REPORTED,
    section_reasons: dict[str, str] | None = None,
) -> D:
    """Build ``cls`` from ``msg``; absent readings get their reason or ``default_reason``.

    ``section_reasons`` gives the default reason for a nested field's readings
    (e.g. the reason its collector could not run).
    """
    descriptors = msg.DESCRIPTOR.fields_by_name
    reasons = dict(msg.unavailable) if "unavailable" in descriptors else {}
    reasons = {**(section_reasons or {}), **reasons}
    nested = _nested(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = field.name
        descriptor = descriptors[name]
        value = getattr(msg, name)
        if name in nested:
            sub = nested[name]
            if descriptor.is_repeated:
                reason = reasons.get(name, default_reason)
                kwargs[name] = tuple(from_proto(sub, item, reason) for item in value)
            else:
                kwargs[name] = from_proto(sub, value, reasons.get(name, default_reason))
        elif descriptor.is_repeated:
            kwargs[name] = tuple(value)
        elif descriptor.has_presence and not msg.HasField(name):
            kwargs[name] = Unavailable(reasons.get(name, default_reason))
        else:
            kwargs[name] = value
    return cls(**kwargs)


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


class JsonFormatError(ValueError):
    """A JSON document that does not have the snapshot schema."""


def from_json(cls: type[D], data: dict[str, Any]) -> D:
    """The inverse of ``to_json``."""
    if not isinstance(data, dict):
        raise JsonFormatError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    reasons = data.get("unavailable") or {}
    nested = _nested(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = field.name
        if name not in data:
            raise JsonFormatError(f"{cls.__name__}: missing field {name!r}")
        value = data[name]
        if name in nested:
            sub = nested[name]
            if isinstance(value, list):
                kwargs[name] = tuple(from_json(sub, item) for item in value)
            else:
                kwargs[name] = from_json(sub, value)
        elif value is None and name in reasons:
            kwargs[name] = Unavailable(reasons[name])
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)
