"""Helpers for the trace tests: real PyTorch trainers polling an agent's Kineto endpoint, and the CLI."""

from __future__ import annotations

import contextlib
import os
import pathlib
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from testkit.agents import RunningAgent, stop_process
from tuiprof.commands.run import launch_environment
from testkit.ports import free_port

TRAINER = pathlib.Path(__file__).parent.parent / "traces" / "trainer.py"
REGISTER_TIMEOUT_SECONDS = 60.0
READY_TIMEOUT_SECONDS = 90.0


def kineto_env(socket_dir: pathlib.Path, **extra: str) -> dict[str, str]:
    """Environment for a trainer: daemon mode, our socket dir, and a 1 s poll period
    (the base config file is the only way to shorten libkineto's 5 s default)."""
    base = socket_dir / "kineto-base.conf"
    base.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TUIPROF_TOKEN", "RANK")}
    env.update(KINETO_USE_DAEMON="1", KINETO_IPC_SOCKET_DIR=str(socket_dir), KINETO_CONFIG=str(base), **extra)
    return env


def wait_registered(agent: RunningAgent, pid: int, timeout: float = REGISTER_TIMEOUT_SECONDS) -> None:
    """Until the agent logged that ``pid`` polls its Kineto endpoint."""
    deadline = time.monotonic() + timeout
    needle = "Kineto client registered"
    while time.monotonic() < deadline:
        if any(needle in line and f"pid={pid}" in line for line in agent.log().splitlines()):
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} never registered with the agent:\n{agent.log()[-3000:]}")


@contextlib.contextmanager
def trainers(socket_dir: pathlib.Path, ranks: list[int | None], seconds: float = 90.0,
             under_tuiprof_run: bool = False) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Training processes (one per rank; None = no RANK set); a world > 1 joins a gloo group.
    ``under_tuiprof_run``: in the environment `tuiprof run` gives (hook library, step counts)."""
    master_port = str(free_port())
    processes = []
    try:
        for rank in ranks:
            extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port}
            if rank is not None:
                extra["RANK"] = str(rank)
            world = len(ranks) if all(r is not None for r in ranks) and len(ranks) > 1 else 1
            env = kineto_env(socket_dir, **extra)
            processes.append(subprocess.Popen(
                [sys.executable, str(TRAINER), "--seconds", str(seconds), "--world", str(world)],
                env=launch_environment(env, trace_dir=None) if under_tuiprof_run else env, stdout=subprocess.PIPE,
                stderr=tempfile.TemporaryFile()))  # a file: an unread pipe could fill and stall it
        for process in processes:
            _wait_ready(process)
        yield processes
    finally:
        for process in processes:
            stop_process(process)
            if process.stdout is not None:
                process.stdout.close()


def _wait_ready(process: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT_SECONDS) -> None:
    """Until the trainer printed "ready" (its loop runs: torch imported, process group joined)."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if readable else b""
    if line.strip() != b"ready":
        process.kill()
        process.wait(10)
        raise AssertionError(f"trainer {process.pid} not ready after {timeout} s")


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)

