"""Generate ``tuiprof/model/messages.py``: the console's frozen dataclasses, one per proto message.

Run ``python -m tuiprof.model.generate`` after editing the .proto (and
regenerating its stubs with ``python -m agentd.proto.generate``);
``tests/console/test_model_messages.py`` fails while the checked-in module is
stale. Every message reachable from the roots below becomes a dataclass named
as in the proto, with one field per proto field:

- a proto3 ``optional`` scalar is a ``Reading`` (the number, or ``Unavailable``
  with the reason from the message's ``unavailable`` map), an ``optional string``
  the text or ``Unavailable``;
- a plain scalar keeps its Python type, a repeated field is a tuple;
- a message field is the nested dataclass (listed in ``NESTED`` for
  ``convert.from_proto``); a class with such fields derives from
  ``convert.NestedOnFirstRead``, so they are converted when first read;
- an enum field (a closed vocabulary) is a ``StrEnum`` generated beside the classes, one
  member per value, named without the enum's prefix (``HangLevel.HUNG``) and valued by its
  ``word`` option (``"hung"``; UNSPECIFIED ``""``), so the words users see are the model's;
  listed in ``ENUMS`` for ``convert.from_proto``;
- the ``unavailable`` map itself has no field: its reasons live in the Readings.

Anything else (another map, bytes, a oneof) has no place yet and stops the
generator with the field's name. Hand-written behaviour (``RankStats.label``,
``CpuStats.busy_percent``, …) comes from ``<Message>Mixin`` classes in
``tuiprof.model.behaviour``, which the generated classes derive from.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import value_word
from tuiprof.errors import TuiprofError
from tuiprof.model import behaviour
from tuiprof.model.values import REASONS_FIELD

TARGET = pathlib.Path(__file__).with_name("messages.py")


def _descriptor(message: type[Message]) -> Descriptor:
    """``message``'s descriptor: upb's is a Descriptor at run time, which the type stubs keep apart."""
    descriptor = message.DESCRIPTOR
    if not isinstance(descriptor, Descriptor):
        raise TypeError(f"{message.__name__}.DESCRIPTOR is a {type(descriptor).__name__}, not a Descriptor")
    return descriptor


ROOTS = (_descriptor(pb.HostSnapshot), _descriptor(pb.AgentInfo), _descriptor(pb.TraceTarget))
"""The messages the console keeps: snapshots, agent info, and trace targets (capture progress)."""

_SCALARS = {
    FieldDescriptor.CPPTYPE_INT32: "int", FieldDescriptor.CPPTYPE_INT64: "int",
    FieldDescriptor.CPPTYPE_UINT32: "int", FieldDescriptor.CPPTYPE_UINT64: "int",
    FieldDescriptor.CPPTYPE_DOUBLE: "float", FieldDescriptor.CPPTYPE_FLOAT: "float",
    FieldDescriptor.CPPTYPE_BOOL: "bool", FieldDescriptor.CPPTYPE_STRING: "str",
}

HEADER = '''"""The proto's messages as the console's frozen dataclasses. GENERATED: do not edit.

Made by ``python -m tuiprof.model.generate`` from agentd/proto/tuiprof_agent.proto
(see that module for the rules); behaviour comes from ``tuiprof.model.behaviour``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from tuiprof.model import behaviour
from tuiprof.model.convert import NestedOnFirstRead
from tuiprof.model.values import Reading, Unavailable
'''


class NoPlaceError(TuiprofError):
    """A proto field the generated model has no way to hold."""


def reachable(roots: tuple[Descriptor, ...] = ROOTS) -> list[Descriptor]:
    """Every message reachable from ``roots``, each after the messages it holds (definition order)."""
    ordered: list[Descriptor] = []

    def visit(message: Descriptor) -> None:
        if message in ordered:
            return
        for field in message.fields:
            if field.message_type is not None and not _is_reasons(field):
                visit(field.message_type)
        ordered.append(message)

    for root in roots:
        visit(root)
    return ordered


def _is_reasons(field: FieldDescriptor) -> bool:
    return field.name == REASONS_FIELD and field.message_type is not None \
        and field.message_type.GetOptions().map_entry


def field_type(field: FieldDescriptor) -> str:
    """The annotation of ``field`` in the generated dataclass (NoPlaceError when it has none)."""
    where = field.full_name
    if _in_real_oneof(field):
        raise NoPlaceError(f"{where}: oneof fields have no place in the console model")
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            raise NoPlaceError(f"{where}: only the '{REASONS_FIELD}' map has a place (as the Readings' reasons)")
        inner = field.message_type.name
    elif field.enum_type is not None:
        inner = field.enum_type.name
    elif field.cpp_type in _SCALARS:
        inner = _SCALARS[field.cpp_type]
    else:
        raise NoPlaceError(f"{where}: {field.type} fields (bytes) have no place in the console model")
    if field.is_repeated:
        return f"tuple[{inner}, ...]"
    if field.message_type is None and field.has_presence:
        return "str | Unavailable" if inner == "str" else "Reading"
    return inner


def _in_real_oneof(field: FieldDescriptor) -> bool:
    """In a declared ``oneof`` (proto3 ``optional`` puts a field in a synthetic one of its own)."""
    oneof = field.containing_oneof
    return oneof is not None and not (oneof.name == f"_{field.name}" and len(oneof.fields) == 1)


def _fields(message: Descriptor) -> Iterator[FieldDescriptor]:
    return (f for f in message.fields if not _is_reasons(f))


def enums(messages: list[Descriptor]) -> list[EnumDescriptor]:
    """The enums the fields of ``messages`` hold, in order of first use."""
    used = [f.enum_type for message in messages for f in _fields(message) if f.enum_type is not None]
    return list(dict.fromkeys(used))


def member_name(enum: EnumDescriptor, value_name: str) -> str:
    """``HANG_LEVEL_HUNG`` of ``HangLevel`` is ``HUNG``: the proto's value names carry their enum's name."""
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    if not value_name.startswith(prefix):
        raise NoPlaceError(f"{enum.full_name}.{value_name}: a value's name must start with {prefix}")
    return value_name.removeprefix(prefix)


def render_enum(enum: EnumDescriptor) -> str:
    lines = ["", "", f"class {enum.name}(StrEnum):",
             f'    """``{enum.full_name}``, each value as its word."""', ""]
    lines += [f"    {member_name(enum, value.name)} = {json.dumps(value_word(value))}" for value in enum.values]
    return "\n".join(lines) + "\n"


def render_class(message: Descriptor) -> str:
    mixin = f"{message.name}Mixin"
    nested = {f.name: f.message_type.name for f in _fields(message) if f.message_type is not None}
    enum_fields = {f.name: f.enum_type.name for f in _fields(message) if f.enum_type is not None}
    bases = [f"behaviour.{mixin}"] * hasattr(behaviour, mixin) + ["NestedOnFirstRead"] * bool(nested)
    base = f"({', '.join(bases)})" if bases else ""
    lines = ["", "", "@dataclass(frozen=True, slots=True)", f"class {message.name}{base}:",
             f'    """``{message.full_name}``."""', ""]
    lines += [f"    {field.name}: {field_type(field)}" for field in _fields(message)]
    if nested:
        entries = ", ".join(f'"{name}": {type_name}' for name, type_name in nested.items())
        lines.append(f"    NESTED: ClassVar[dict[str, type]] = {{{entries}}}")
    if enum_fields:
        entries = ", ".join(f'"{name}": {type_name}' for name, type_name in enum_fields.items())
        lines.append(f"    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {{{entries}}}")
    return "\n".join(lines) + "\n"


def render() -> str:
    """The whole generated module."""
    messages = reachable()
    return HEADER + "".join(map(render_enum, enums(messages))) + "".join(map(render_class, messages))


def main() -> int:
    try:
        text = render()
    except NoPlaceError as exc:
        print(f"tuiprof.model.generate: {exc}; give it a place in {__name__} first", file=sys.stderr)
        return 1
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
