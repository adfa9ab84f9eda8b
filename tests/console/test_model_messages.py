"""The console model is derived from the proto: generated, current, and with a place for every field."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import word
from tuiprof.model import generate, messages
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived
from tuiprof.model.export import cluster_document
from tuiprof.model.values import Unavailable


def test_the_generated_module_is_current() -> None:
    checked_in = pathlib.Path(messages.__file__).read_text()
    assert checked_in == generate.render(), "stale: run `python -m tuiprof.model.generate`"


def _messages_from(root: Descriptor) -> list[Descriptor]:
    """Every message type reachable from ``root`` through its fields (maps' entry types excluded)."""
    seen: list[Descriptor] = []
    pending = [root]
    while pending:
        message = pending.pop()
        if message in seen or message.GetOptions().map_entry:
            continue
        seen.append(message)
        pending.extend(f.message_type for f in message.fields if f.message_type is not None)
    return seen


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def test_every_field_reachable_from_a_host_snapshot_has_a_place() -> None:
    reached = _messages_from(pb.HostSnapshot.DESCRIPTOR)
    assert {"RankStats", "HookHealth", "ProcessGroupProgress", "GpuStats"} <= {m.name for m in reached}
    for message in reached:
        model = getattr(messages, message.name, None)
        assert model is not None, f"{message.full_name} has no class in tuiprof.model.messages"
        names = {f.name for f in dataclasses.fields(model)}
        for field in message.fields:
            if field.name == "unavailable" and _is_map(field):
                optional = [f for f in message.fields if f.has_presence and f.message_type is None]
                assert optional, f"{message.name}.unavailable: reasons with no optional reading to explain"
                continue
            assert field.name in names, f"{message.name}.{field.name} has no place in {model.__name__}"


def _filled(message: Message, depth: int = 0) -> Message:
    """``message`` with every field set to a value that is not the default (one element per list)."""
    for field in message.DESCRIPTOR.fields:
        if _is_map(field):
            continue
        if field.message_type is not None:
            target = getattr(message, field.name).add() if field.is_repeated else getattr(message, field.name)
            _filled(target, depth + 1)
            continue
        value = {FieldDescriptor.CPPTYPE_STRING: f"{field.name}-text", FieldDescriptor.CPPTYPE_BOOL: True,
                 FieldDescriptor.CPPTYPE_DOUBLE: field.number + 0.5, FieldDescriptor.CPPTYPE_FLOAT: field.number + 0.5,
                 FieldDescriptor.CPPTYPE_ENUM: field.enum_type and field.enum_type.values[-1].number,
                 }.get(field.cpp_type, field.number + depth)
        if field.is_repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def _paths(message: Message, prefix: str = "") -> dict[str, object]:
    """Every scalar of ``message`` by its JSON path (``ranks.0.hook.pending``); an enum's value as its word."""
    out: dict[str, object] = {}
    for field, value in message.ListFields():
        if _is_map(field):
            continue
        path = f"{prefix}{field.name}"
        items = list(value) if field.is_repeated else [value]
        for index, item in enumerate(items):
            where = f"{path}.{index}" if field.is_repeated else path
            if field.message_type is not None:
                out |= _paths(item, where + ".")
            else:
                out[where] = word(field.enum_type, item) if field.enum_type is not None else item
    return out


def _lookup(document: object, path: str) -> object:
    for part in path.split("."):
        document = document[int(part)] if isinstance(document, list) else document[part]  # type: ignore[index]
    return document


def test_status_json_carries_every_field_of_a_full_snapshot() -> None:
    message = _filled(pb.HostSnapshot())
    message.ClearField("collectors")  # collectors all available: no section takes a collector's reason
    message.collectors.add(name="host", available=True)
    cluster = ClusterState(["n1"])
    cluster.apply(SnapshotReceived("n1", 1.0, message))
    document = json.loads(json.dumps(cluster_document(cluster)))["hosts"][0]
    expected = _paths(message)
    assert "ranks.0.hook.dropped_records_total" in expected and "ranks.0.process_groups.0.last_completed" in expected
    assert expected["ranks.0.state"] == "disk-sleep" and expected["hang.level"] == "exited"
    for path, value in expected.items():
        assert _lookup(document, path) == value, path


def test_unset_optional_readings_keep_their_reason() -> None:
    message = pb.HostSnapshot()
    rank = message.ranks.add(pid=7)
    rank.unavailable["step_time_seconds"] = "no step seen yet"
    model = messages.HostSnapshot.from_proto(message)
    assert model.ranks[0].step_time_seconds == Unavailable("no step seen yet")
    assert model.ranks[0].label == "pid 7" and model.ranks[0].hook.inactive_reason == ""
