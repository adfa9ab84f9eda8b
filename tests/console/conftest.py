"""Fixtures for the console tests."""

from __future__ import annotations

import pytest

from console.recordings import GPU_FIXTURE, replay_app
from tuiprof.tui.app import TuiprofApp


@pytest.fixture
def gpu_app() -> TuiprofApp:
    """The console over the synthetic 4-host GPU recording."""
    return replay_app(GPU_FIXTURE)
