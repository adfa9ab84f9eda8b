"""A real torchrun job (CPU, gloo): its launcher polls the agent too, but a capture traces only the ranks.

Seen on 2 x H200 (bench/traces/traces_gpu.md): torchrun's launcher imports torch, so it
registers like a rank; an ``--iterations`` capture then waited ~10 s on it,
though it never steps and has no GPU work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from testkit.agents import stop_process
from testkit.traces import TRAINER, kineto_env, run_cli, trainers, wait_registered

pytestmark = pytest.mark.slow
WORKERS_TIMEOUT_SECONDS = 120.0


@pytest.fixture
def torchrun(socket_dir):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(TRAINER), "--seconds", "120", "--world", "2"]
    with tempfile.TemporaryFile() as log:
        launcher = subprocess.Popen(command, env=kineto_env(socket_dir), stdout=log, stderr=log)
        try:
            yield launcher, _workers(launcher, log)
        finally:
            children = psutil.Process(launcher.pid).children(recursive=True) if launcher.poll() is None else []
            stop_process(launcher)
            for child in children:
                if child.is_running():
                    child.kill()


def _workers(launcher: subprocess.Popen[bytes], log) -> list[int]:
    deadline = time.monotonic() + WORKERS_TIMEOUT_SECONDS
    while time.monotonic() < deadline and launcher.poll() is None:
        workers = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)
                   if str(TRAINER) in " ".join(p.cmdline())]
        if len(workers) == 2:
            return sorted(workers)
        time.sleep(0.2)
    log.seek(0)
    raise AssertionError(f"torchrun did not start 2 workers:\n{log.read().decode(errors='replace')[-3000:]}")


def test_iterations_capture_traces_the_ranks_not_their_launcher(agent, torchrun, tmp_path):
    launcher, workers = torchrun
    for pid in [launcher.pid, *workers]:
        wait_registered(agent, pid)  # the launcher polls like the ranks do
    result = run_cli("trace", agent.address.target, "--iterations", "2", "--pids", str(launcher.pid),
                     "--output", str(tmp_path), "--timeout", "60", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    targets = doc["hosts"][0]["targets"]
    assert sorted(t["pid"] for t in targets) == workers
    assert sorted(t["rank"] for t in targets) == [0, 1]
    assert [r["rank"] for r in doc["summary"]["ranks"]] == [0, 1]


def test_a_rank_that_exited_is_not_a_target(agent, socket_dir, tmp_path):
    # A job ends: for up to a minute its registration outlives it. A capture then waited ~22 s on
    # the dead rank and failed with a reason that blamed `tuiprof run`.
    finished = subprocess.Popen([sys.executable, str(TRAINER), "--seconds", "3"], env=kineto_env(socket_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_registered(agent, finished.pid)
        assert finished.wait(60) == 0
    finally:
        stop_process(finished)
    with trainers(socket_dir, [None]) as [running]:
        wait_registered(agent, running.pid)
        started = time.monotonic()
        result = run_cli("trace", agent.address.target, "--iterations", "1", "--output", str(tmp_path),
                         "--timeout", "60", "--json")
        elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr + result.stdout
    targets = json.loads(result.stdout)["hosts"][0]["targets"]
    assert [t["pid"] for t in targets] == [running.pid]
    assert elapsed < 20, f"the capture took {elapsed:.1f} s"
