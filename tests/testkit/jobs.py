"""Ending a job started under `tuiprof run` in a test: its launcher and every process below it,
and the rank files they left in /dev/shm."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess

import psutil


def stop_job(process: subprocess.Popen) -> None:
    """Kill the launcher and its descendants (each torchrun worker runs in a session of its own),
    wait for them, and remove the workers' segments and the files beside them."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(family, timeout=30)
    process.wait(timeout=30)
    for proc in family:
        for path in pathlib.Path("/dev/shm").glob(f"tuiprof-{os.getuid()}-{proc.pid}-*"):  # segment, side files
            path.unlink(missing_ok=True)
