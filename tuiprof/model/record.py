"""Recordings: one host event per line (NDJSON), messages in the proto's JSON mapping.

Line shapes (``info`` and ``snapshot`` are ``AgentInfo`` / ``HostSnapshot`` in
protobuf's canonical JSON with the .proto field names, so any protobuf library
can read them)::

    {"t": 1732200000.5, "host": "node1:1779", "event": "info", "info": {...}}
    {"t": 1732200001.0, "host": "node1:1779", "event": "snapshot", "snapshot": {...}}
    {"t": 1732200009.0, "host": "node2:1779", "event": "unreachable", "error": "..."}

Recordings carry no format version: the proto's own compatibility rules keep old lines
readable. The closed vocabularies that were strings before issue 26 (a hang level, a rank's
state, a trace target's state, a slowdown's cause) kept their field names as enums, so an
older recording holds their words (``"level": "hung"``) where a newer one holds value names
(``"HANG_LEVEL_HUNG"``); ``decode`` reads a word as the value it names.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any, TypeVar, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import value_word
from tuiprof.errors import BadInputError
from tuiprof.model.events import HostEvent, HostUnreachable, InfoReceived, SnapshotReceived


class RecordFormatError(BadInputError):
    """A recording line that is not a host event; names the file and line."""


def _to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def encode(event: HostEvent) -> str:
    line: dict[str, Any] = {"t": event.at, "host": event.host}
    if isinstance(event, SnapshotReceived):
        line |= {"event": "snapshot", "snapshot": _to_dict(event.message)}
    elif isinstance(event, InfoReceived):
        line |= {"event": "info", "info": _to_dict(event.message)}
    elif isinstance(event, HostUnreachable):
        line |= {"event": "unreachable", "error": event.error}
    else:  # rows from Prometheus: a recording holds what agents sent, nothing computed elsewhere
        raise TypeError(f"not an agent event, not recorded: {event!r}")
    return json.dumps(line, separators=(",", ":"))


def decode(text: str) -> HostEvent:
    """One line back into its event; ValueError (with what is wrong) otherwise."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("a recording line must be a JSON object")
    try:
        kind, host, at = data["event"], str(data["host"]), float(data["t"])
        if kind == "snapshot":
            return SnapshotReceived(host, at, _parse(data["snapshot"], pb.HostSnapshot()))
        if kind == "info":
            return InfoReceived(host, at, _parse(data["info"], pb.AgentInfo()))
        if kind == "unreachable":
            return HostUnreachable(host, at, str(data["error"]))
    except KeyError as exc:
        raise ValueError(f"missing key {exc}") from None
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from None
    raise ValueError(f"unknown event kind {kind!r}")


M = TypeVar("M", bound=Message)


def _parse(data: Any, message: M) -> M:
    descriptor = cast(Descriptor, message.DESCRIPTOR)  # upb's, a Descriptor at run time; the stubs keep them apart
    json_format.ParseDict(_words_as_names(data, descriptor), message)
    return message


def _words_as_names(data: Any, descriptor: Descriptor) -> Any:
    """``data`` (one message in the JSON mapping) with every enum value written as its word, as
    recordings before issue 26 hold them, replaced by the value's name; anything else untouched."""
    if not isinstance(data, dict):
        return data  # not a message: ParseDict says so
    out = dict(data)
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key)
        if field is None or (field.message_type is not None and field.message_type.GetOptions().map_entry):
            continue
        if field.message_type is not None:
            item_type = field.message_type
            out[key] = ([_words_as_names(item, item_type) for item in value] if isinstance(value, list)
                        else _words_as_names(value, item_type))
        elif field.enum_type is not None and isinstance(value, str):
            names = {value_word(v): v.name for v in field.enum_type.values}
            out[key] = value if value in field.enum_type.values_by_name else names.get(value, value)
    return out


def read(path: str | pathlib.Path) -> Iterator[HostEvent]:
    """The events of a recording, in file order."""
    path = pathlib.Path(path)
    try:
        handle = path.open("rb")  # decoded line by line: a binary file is a bad line, not a crash
    except OSError as exc:
        raise RecordFormatError(f"cannot open recording {path}: {exc.strerror}") from exc
    with handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                yield decode(raw.decode("utf-8"))
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
                raise RecordFormatError(
                    f"{path}:{number}: not a tuiprof recording line ({exc}); "
                    "record one with `tuiprof record FILE`"
                ) from None
