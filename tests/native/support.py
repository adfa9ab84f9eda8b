"""Helpers for the native tests (importable as ``native.support``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from tuiprof_native import segment

HOOK = pathlib.Path(segment.__file__).parent / "libtuiprof_hook.so"
T = TypeVar("T")


def tuiprof_run(*command: str, **popen) -> subprocess.Popen:
    """Start `tuiprof run --no-kineto-daemon -- COMMAND` (no agentd here to poll)."""
    env = dict(os.environ)
    env.pop("KINETO_USE_DAEMON", None)
    env.update(popen.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--", *command],
                            env=env, text=True, **popen)


def segment_path(pid: int) -> pathlib.Path:
    return pathlib.Path(segment.SEGMENT_DIR) / f"tuiprof-{os.getuid()}-{pid}"


def wait_for(predicate: Callable[[], T], timeout: float = 10.0) -> T:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)
