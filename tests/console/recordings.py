"""The committed recordings and apps over them (no network)."""

from __future__ import annotations

import pathlib


from tuiprof.client.sources import ReplaySource
from tuiprof.model import record
from tuiprof.tui.app import TuiprofApp

DATA = pathlib.Path(__file__).parent / "data"
GPU_FIXTURE = DATA / "gpu-fixture-4hosts.ndjson"
"""Synthetic (see gpu_fixture.py): 4 GPU hosts, one straggler rank, one hung host, one down."""
AGENTS_RECORDING = DATA / "agents-2hosts.ndjson"
"""Real: `tuiprof record` against two agentd on 127.0.0.1 and 127.0.0.2 (no GPU)."""


def replay_app(path: pathlib.Path = GPU_FIXTURE) -> TuiprofApp:
    """The console over a recording, all events applied at once (deterministic frames)."""
    return TuiprofApp(ReplaySource(list(record.read(path)), speed=0))


