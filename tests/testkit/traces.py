"""Helpers for the trace tests: real PyTorch trainers polling an agent's Kineto endpoint (as root or as a
second, unprivileged user), a client playing libkineto on the wire, and the CLI."""

from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

from testkit.agents import RunningAgent, stop_process
from tuiprof.commands.run import launch_environment
from testkit.ports import free_port

TRAINER = pathlib.Path(__file__).parent.parent / "traces" / "trainer.py"
HOSTILE_USER = "tuiprof-hostile"
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


def hostile_user() -> tuple[int, int]:
    """(uid, gid) of the unprivileged local user the tests play an attacker with; created when
    missing (needs root, as does running anything as that user: the test is skipped otherwise)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second, unprivileged local user")
    try:
        entry = pwd.getpwnam(HOSTILE_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip(f"no user {HOSTILE_USER} and no useradd to create it")
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", HOSTILE_USER], check=True, timeout=30)
        entry = pwd.getpwnam(HOSTILE_USER)
    return entry.pw_uid, entry.pw_gid


def as_user(user: tuple[int, int], command: list[str]) -> list[str]:
    """``command`` run as ``user`` (uid, gid) with no supplementary groups."""
    return ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--", *command]


class KinetoClient:
    """Plays libkineto's IpcFabricConfigClient: its own named socket in the endpoint's socket dir."""

    def __init__(self, socket_dir: pathlib.Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(socket_dir / f"dynoconfigclient{uuid.uuid4()}"))
        self.sock.settimeout(1.0)
        self.server = str(socket_dir / "dynolog")

    def send(self, datagram: bytes) -> None:
        self.sock.sendto(datagram, self.server)

    def reply(self) -> bytes:
        return self.sock.recv(65536)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def trainers(socket_dir: pathlib.Path, ranks: list[int | None], seconds: float = 90.0,
             under_tuiprof_run: bool = False,
             user: tuple[int, int] | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Training processes (one per rank; None = no RANK set); a world > 1 joins a gloo group.
    ``under_tuiprof_run``: in the environment `tuiprof run` gives (hook library, step counts).
    ``user``: (uid, gid) to run them as; the socket dir must then be writable by that user."""
    master_port = str(free_port())
    processes = []
    try:
        for rank in ranks:
            extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port}
            if rank is not None:
                extra["RANK"] = str(rank)
            world = len(ranks) if all(r is not None for r in ranks) and len(ranks) > 1 else 1
            env = kineto_env(socket_dir, **extra)
            command = [sys.executable, str(TRAINER), "--seconds", str(seconds), "--world", str(world)]
            if user is not None:
                env["HOME"] = str(socket_dir)  # somewhere that user may write caches
            with tempfile.TemporaryFile() as stderr:
                processes.append(subprocess.Popen(
                    as_user(user, command) if user is not None else command,
                    env=launch_environment(env, trace_dir=None) if under_tuiprof_run else env, stdout=subprocess.PIPE,
                    stderr=stderr))  # a file: an unread pipe could fill and stall it
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


def run_cli(*args: str, timeout: float = 120.0, user: tuple[int, int] | None = None,
            home: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    """`tuiprof ARGS` (as ``user`` when given, with ``home`` as its HOME)."""
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    if home is not None:
        env["HOME"] = str(home)
    command = [sys.executable, "-m", "tuiprof.cli", *args]
    return subprocess.run(as_user(user, command) if user is not None else command, capture_output=True, text=True,
                          timeout=timeout, env=env)

