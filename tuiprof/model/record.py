"""Recordings: one host event per line (NDJSON), the same JSON as ``status --json``.

Line shapes::

    {"t": 1732200000.5, "host": "node1", "event": "info", "info": {...AgentInfo...}}
    {"t": 1732200001.0, "host": "node1", "event": "snapshot", "snapshot": {...HostSnapshot...}}
    {"t": 1732200009.0, "host": "node2", "event": "unreachable", "error": "..."}
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

from tuiprof.model.convert import JsonFormatError
from tuiprof.model.events import HostEvent, HostUnreachable, InfoReceived, SnapshotReceived
from tuiprof.model.info import AgentInfo
from tuiprof.model.snapshot import HostSnapshot


class RecordFormatError(ValueError):
    """A recording line that is not a host event; names the file and line."""


def encode(event: HostEvent) -> str:
    line: dict[str, Any] = {"t": event.at, "host": event.host}
    if isinstance(event, SnapshotReceived):
        line |= {"event": "snapshot", "snapshot": event.snapshot.to_json()}
    elif isinstance(event, InfoReceived):
        line |= {"event": "info", "info": event.info.to_json()}
    else:
        line |= {"event": "unreachable", "error": event.error}
    return json.dumps(line, separators=(",", ":"))


def decode(text: str) -> HostEvent:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise JsonFormatError("a recording line must be a JSON object")
    try:
        kind, host, at = data["event"], data["host"], float(data["t"])
        if kind == "snapshot":
            return SnapshotReceived(host, at, HostSnapshot.from_json(data["snapshot"]))
        if kind == "info":
            return InfoReceived(host, at, AgentInfo.from_json(data["info"]))
        if kind == "unreachable":
            return HostUnreachable(host, at, str(data["error"]))
    except KeyError as exc:
        raise JsonFormatError(f"missing key {exc}") from None
    raise JsonFormatError(f"unknown event kind {kind!r}")


def read(path: str | pathlib.Path) -> Iterator[HostEvent]:
    """The events of a recording, in file order."""
    path = pathlib.Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise RecordFormatError(f"cannot open recording {path}: {exc.strerror}") from exc
    with handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                yield decode(text)
            except (ValueError, TypeError) as exc:
                raise RecordFormatError(
                    f"{path}:{number}: not a tuiprof recording line ({exc}); "
                    "record one with `tuiprof record FILE`"
                ) from None
