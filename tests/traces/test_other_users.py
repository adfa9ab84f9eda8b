"""An agent that is not root hands trace configs only to its own user's processes (uid from SO_PASSCRED)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from testkit.agents import agentd_command, healthz_status, stop_process
from testkit.ports import free_port
from testkit.traces import run_cli, trainers, wait_registered

pytestmark = pytest.mark.slow
NOBODY = 65534


class NobodyAgent:
    def __init__(self, port: int, log_path: pathlib.Path) -> None:
        self.target = f"127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def agent_as_nobody(socket_dir: pathlib.Path) -> Iterator[NobodyAgent]:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="tpa", dir="/tmp"))
    directory.chmod(0o777)
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    log_path = directory / "agentd.log"
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *agentd_command(
        ["--port", str(port), "--metrics-port", str(metrics_port), "--trace-dir", str(directory / "traces")])]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file, env=env)
    try:
        deadline = time.monotonic() + 30
        while healthz_status("127.0.0.1", metrics_port) != 200:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        yield NobodyAgent(port, log_path)
    finally:
        stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)


def test_root_process_is_refused_by_an_agent_running_as_nobody(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the agent as another user")
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    socket_dir.chmod(0o777)
    try:
        with agent_as_nobody(socket_dir) as agent, trainers(socket_dir, [None]) as [trainer]:
            wait_registered(agent, trainer.pid)
            result = run_cli("trace", agent.target, "--duration-ms", "300", "--pids", str(trainer.pid),
                             "--output", str(tmp_path), "--json")
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert result.returncode == 1
    [target] = json.loads(result.stdout)["hosts"][0]["targets"]
    assert target["pid"] == trainer.pid and target["state"] == "refused"
    assert target["reason"].startswith(f"the process belongs to uid 0; this agent runs as uid {NOBODY}")
