"""`tuiprof trace` right after a job starts: it waits up to libkineto's poll period for a process to
register with the agent, says so on stderr in one line, then traces it, or fails with the agent's reason."""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from testkit.agents import RunningAgent, running_agent, stop_process
from testkit.traces import run_cli, trainers
from tuiprof.client.capture import REGISTRATION_WAIT_SECONDS

pytestmark = pytest.mark.slow
WAITING = "tuiprof trace: waiting up to 5 s for a training process to register with the agent at"
# The trainer polls every 1 s (see kineto_env); 1 s poll + 2 s pickup + 1 s warmup, plus slack for a loaded machine.
START_DELAY_MS = "6000"


@pytest.fixture
def lone_agent(tmp_path: pathlib.Path) -> Iterator[tuple[RunningAgent, pathlib.Path]]:
    """(an agent no process has ever polled, the private socket dir of its Kineto endpoint)."""
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    try:
        with running_agent(tmp_path / "agent", env=env) as agent:
            yield agent, socket_dir
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_process_started_after_the_command_is_waited_for_and_traced(lone_agent, tmp_path):
    agent, socket_dir = lone_agent
    command = [sys.executable, "-m", "tuiprof.cli", "trace", agent.address.target, "--duration-ms", "1000",
               "--start-delay-ms", START_DELAY_MS, "--output", str(tmp_path / "out"), "--fetch", "all", "--json"]
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    trace = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # The trainer starts only once the command said it waits: nothing polled the agent before.
        assert trace.stderr is not None
        readable, _, _ = select.select([trace.stderr], [], [], 30)
        first_line = trace.stderr.readline() if readable else ""
        assert first_line.startswith(WAITING), first_line
        with trainers(socket_dir, [None]) as [trainer]:
            stdout, stderr = trace.communicate(timeout=60)
    finally:
        stop_process(trace)
    assert trace.returncode == 0, first_line + stderr + stdout
    assert WAITING not in stderr  # one line, once
    [host] = json.loads(stdout)["hosts"]
    [target] = host["targets"]
    assert (target["pid"], target["state"]) == (trainer.pid, "written")
    assert pathlib.Path(target["local"]).stat().st_size > 0


def test_no_process_registering_fails_after_the_wait_with_the_agents_reason(lone_agent, tmp_path):
    agent, _ = lone_agent
    started = time.monotonic()
    result = run_cli("trace", agent.address.target, "--duration-ms", "1000", "--output", str(tmp_path / "out"))
    assert time.monotonic() - started >= REGISTRATION_WAIT_SECONDS
    assert result.returncode == 1, result.stderr + result.stdout
    assert [line for line in result.stderr.splitlines() if line.startswith(WAITING)] == \
        [f"{WAITING} {agent.address.target} (start it under `tuiprof run`)"]
    assert "no processes matched on any host:" in result.stdout
    assert "no process is polling this agent" in result.stdout
