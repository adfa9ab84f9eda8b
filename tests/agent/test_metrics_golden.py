"""The whole /metrics exposition of one fixed snapshot, compared byte for byte with a checked-in file.

Like node_exporter's end-to-end fixture: renaming, dropping or re-labelling any
metric changes ``data/metrics.golden.prom`` and fails here on purpose, so the
change is a deliberate, reviewed diff of that file (dashboards and alerts
depend on these names). When the change is intended, regenerate with

    TUIPROF_UPDATE_GOLDEN=1 .venv/bin/pytest tests/agent/test_metrics_golden.py

and commit the new golden file with the code. The input is
``data/metrics.golden.snapshot.txtpb``, a snapshot with every proto field set
somewhere (checked below, so a new field gets a decision: exported or not).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
from google.protobuf import descriptor, text_format

from agentd.prometheus import render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectRun

DATA = pathlib.Path(__file__).parent / "data"
SNAPSHOT = DATA / "metrics.golden.snapshot.txtpb"
GOLDEN = DATA / "metrics.golden.prom"
UPDATE = os.environ.get("TUIPROF_UPDATE_GOLDEN") == "1"
PROMTOOL = shutil.which("promtool")

INFO = pb.AgentInfo(hostname="gpu-node-07", agent_version="0.9.0", driver_version="580.159.04",
                    nvml_version="13.580.159.04", cuda_driver_version="13.0")
RUNS = {
    "host": CollectRun(duration_seconds=0.00125, success=True, last_error="", cpu_seconds_total=3.5),
    "gpu": CollectRun(duration_seconds=0.0183, success=True, last_error="collect failed: NVMLError: Unknown Error",
                      cpu_seconds_total=41.25),
    "pmu": CollectRun(duration_seconds=0.0004, success=True, last_error="", cpu_seconds_total=0.75),
    "ranks": CollectRun(duration_seconds=0.0021, success=False, last_error="collect failed: OSError: [Errno 24]",
                        cpu_seconds_total=2.0),
}


def fixture_snapshot() -> pb.HostSnapshot:
    return text_format.Parse(SNAPSHOT.read_text(), pb.HostSnapshot())


def rendered() -> str:
    return render_metrics(fixture_snapshot(), INFO, RUNS)


def test_exposition_matches_the_golden_file() -> None:
    text = rendered()
    if UPDATE:
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"{GOLDEN} is missing; create it with TUIPROF_UPDATE_GOLDEN=1"
    golden = GOLDEN.read_text()
    if text != golden:
        pytest.fail(
            "/metrics output differs from tests/agent/data/metrics.golden.prom: a metric was renamed, "
            "dropped, added or relabelled. If that is intended, regenerate it with "
            "TUIPROF_UPDATE_GOLDEN=1 .venv/bin/pytest tests/agent/test_metrics_golden.py and commit the diff.\n"
            + _first_difference(golden, text)
        )


def _first_difference(golden: str, text: str) -> str:
    expected, actual = golden.splitlines(), text.splitlines()
    for number, (want, got) in enumerate(zip(expected, actual, strict=False), 1):  # lengths: told below
        if want != got:
            return f"line {number}:\n  golden: {want}\n  now:    {got}"
    return f"golden has {len(expected)} lines, the output {len(actual)}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt package prometheus, tests/run.sh installs it)")
def test_golden_file_passes_promtool() -> None:
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def _messages_reachable(message: descriptor.Descriptor) -> dict[str, descriptor.Descriptor]:
    """Every message type a HostSnapshot can contain (map entries left out), by full name."""
    found = {message.full_name: message}
    for field in message.fields:
        inner = field.message_type
        if inner is not None and not inner.GetOptions().map_entry and inner.full_name not in found:
            found.update(_messages_reachable(inner))
    return found


def _fields_set(message: object, seen: set[tuple[str, str]]) -> None:
    for field, value in message.ListFields():  # type: ignore[attr-defined]
        seen.add((message.DESCRIPTOR.full_name, field.name))  # type: ignore[attr-defined]
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        for item in value if field.is_repeated else [value]:
            _fields_set(item, seen)


def test_the_snapshot_fixture_sets_every_field() -> None:
    seen: set[tuple[str, str]] = set()
    _fields_set(fixture_snapshot(), seen)
    every = {(name, field.name) for name, message in _messages_reachable(pb.HostSnapshot.DESCRIPTOR).items()
             for field in message.fields}
    missing = sorted(f"{message}.{field}" for message, field in every - seen)
    assert not missing, (
        f"set these fields (non-zero) in {SNAPSHOT.name}, decide whether prometheus.py exports them, "
        f"then regenerate the golden file (TUIPROF_UPDATE_GOLDEN=1): {', '.join(missing)}"
    )
