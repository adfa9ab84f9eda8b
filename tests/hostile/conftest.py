"""The hostile-local-user suite: a root agent, and a real second user who tries to turn it.

Every test gets a fresh private mount + network namespace (own loopback, own 8 MiB
/dev/shm; see testkit/namespaces.py), a root ``agentd`` inside it, and runs the
attacks as the user ``tuiprof-hostile`` inside the same namespaces. Skipped, with
the reason, where that cannot be set up (not root, no such user, missing tools).

Hooks for cases other areas add (forged segments, Kineto injection, FetchFile
races, full /dev/shm):

- ``hostile_user``: the ``User`` (name, uid, gid);
- ``namespace``: the ``Namespace`` (``run``/``popen``/``argv``, optionally as a user);
- ``agent_in_namespace(*extra_args, env=None)``: starts the root agent in it, returns a
  ``HostileAgent`` (``port``, ``metrics_port``, ``trace_dir``, ``process``,
  ``client(...)``, ``assert_healthy()``); its trace dir's parents are 0711, as a
  real one's are, so the other user reaches their own folder in it;
- ``run_as_hostile(argv)``: a command inside the namespace as the hostile user;
- ``start_rank(user, secret)``: a real rank process (``tuiprof run``'s environment, a step every 0.1 s,
  a thread that died with ``secret`` in its exception) inside the namespace.

Each case asserts the refusal and that the agent stays healthy (``/healthz`` answers
200 within 1 s and RPCs are answered).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from testkit.agents import stop_process
from testkit.namespaces import HOSTILE_USER, Namespace, User, unavailable_reason, wait_ready
from testkit.ports import free_port
from tuiprof.commands.run import launch_environment

CLIENT = pathlib.Path(__file__).with_name("client.py")
PYTHON = sys.executable
AGENTD = str(pathlib.Path(sys.executable).parent / "agentd")
HEALTHY_WITHIN_SECONDS = 1.0
START_TIMEOUT_SECONDS = 30.0

# torch is imported because the startup hook records uncaught exceptions only in torch programs.
RANK_PROGRAM = """
import ctypes, os, sys, threading, time
import torch  # noqa: F401
lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
lib.tuiprof_record_step()
def load_batch():
    raise ValueError(sys.argv[1])
worker = threading.Thread(target=load_batch, name="loader")
worker.start()
worker.join()
print("ready", flush=True)
def parked_in_rank_main():
    while True:  # a step every 0.1 s: never hung unless stopped
        time.sleep(0.1)
        lib.tuiprof_record_step()
parked_in_rank_main()
"""


@pytest.fixture(scope="session")
def hostile_user() -> User:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return User.lookup(HOSTILE_USER)


@pytest.fixture
def namespace(hostile_user) -> Iterator[Namespace]:
    with Namespace.create() as ns:
        yield ns


@dataclasses.dataclass
class HostileAgent:
    """The root agent inside ``namespace``."""

    namespace: Namespace
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    trace_dir: pathlib.Path
    log_path: pathlib.Path

    def client(self, *args: str, user: User | None = None, timeout: float = 60) -> dict:
        """tests/hostile/client.py ARGS inside the namespace, as ``user`` (None: root); its JSON."""
        done = self.namespace.run([PYTHON, CLIENT, "--port", str(self.port), *args], user=user, timeout=timeout)
        assert done.returncode == 0, f"client failed ({done.returncode}): {done.stderr}"
        return json.loads(done.stdout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assert_healthy(self, user: User | None = None) -> None:
        """/healthz says 200 within a second and GetInfo is answered (asked as ``user``)."""
        assert self.process.poll() is None, f"agentd exited with {self.process.returncode}:\n{self.log()}"
        health = self.client("healthz", "--metrics-port", str(self.metrics_port), user=user)
        assert health.get("status") == 200 and health["seconds"] < HEALTHY_WITHIN_SECONDS, health
        assert self.client("info", user=user)["code"] == "OK"


@pytest.fixture
def agent_in_namespace(namespace) -> Iterator[Callable[..., HostileAgent]]:
    started: list[HostileAgent] = []
    # Not under pytest's tmp_path (0700 parents): the other user must reach their folder in the trace dir.
    base = pathlib.Path(tempfile.mkdtemp(prefix="tph", dir="/tmp"))
    base.chmod(0o711)

    def start(*extra_args: str, env: dict[str, str] | None = None) -> HostileAgent:
        """``env``: the agent's environment (default: this process's, without a token)."""
        port, metrics_port = free_port(), free_port()
        trace_dir = base / f"agent-{port}" / "traces"
        trace_dir.parent.mkdir(mode=0o711)
        log_path = trace_dir.parent / "agentd.log"
        with open(log_path, "wb") as log_file:
            process = namespace.popen(
                [AGENTD, "--interval-ms", "200", "--host", "127.0.0.1", "--port", str(port),
                 "--metrics-port", str(metrics_port), "--trace-dir", str(trace_dir), *extra_args],
                stdout=subprocess.DEVNULL, stderr=log_file, env=env or namespace.env(None))
        agent = HostileAgent(namespace, process, port, metrics_port, trace_dir, log_path)
        started.append(agent)
        _wait_serving(agent)
        return agent

    yield start
    for agent in started:
        stop_process(agent.process)
    shutil.rmtree(base, ignore_errors=True)


def _wait_serving(agent: HostileAgent) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        assert agent.process.poll() is None, f"agentd exited with {agent.process.returncode}:\n{agent.log()}"
        if agent.client("healthz", "--metrics-port", str(agent.metrics_port)).get("status") == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"agentd not healthy after {START_TIMEOUT_SECONDS} s:\n{agent.log()}")


@pytest.fixture
def run_as_hostile(namespace, hostile_user) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(command, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return namespace.run(command, user=hostile_user, timeout=timeout)

    return run


@pytest.fixture
def start_rank(namespace) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    ranks: list[subprocess.Popen[str]] = []

    def start(user: User | None, secret: str) -> subprocess.Popen[str]:
        # tuiprof run's environment, set here rather than by `tuiprof run` exec'ing Python: this
        # checkout's interpreter may live under a directory the other user cannot traverse
        # (setpriv's own exec gets there, a second exec by that user would not).
        env = launch_environment(namespace.env(user), kineto_daemon=False)
        rank = namespace.popen([PYTHON, "-c", RANK_PROGRAM, secret], user=user, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ranks.append(rank)
        return wait_ready(rank)

    yield start
    for rank in ranks:
        rank.kill()
        rank.wait(10)
