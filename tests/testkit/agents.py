"""Real agentd processes for tests: start one on a loopback address, wait until it serves, kill it.

    with running_agent(tmp_path, host="127.0.0.2") as agent:
        channel = open_channel(agent.address, agent.token)
        httpx.get(f"{agent.metrics_url}/metrics")

The agent runs ``python -m agentd.cli`` (the installed code, all real collectors)
with free ports and a trace dir under ``tmp_path``; its stderr log is kept in
``tmp_path`` and shown when it fails to start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import pathlib
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from agentd.collectors.base import Collector
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.ports import free_port
from agentd.address import AgentAddress

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0


class AgentStartError(RuntimeError):
    """agentd exited or never became healthy; the message carries its log."""


@dataclasses.dataclass
class RunningAgent:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    metrics_port: int
    token: str | None
    trace_dir: pathlib.Path
    log_path: pathlib.Path
    tls_cert: pathlib.Path | None = None  # also the CA a client trusts (self-signed)

    @property
    def connect_host(self) -> str:
        """Where to connect: the bound address, or loopback for a wildcard bind."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)

    @property
    def address(self) -> AgentAddress:
        return AgentAddress(self.connect_host, self.port)

    @property
    def metrics_url(self) -> str:
        scheme = "https" if self.tls_cert is not None else "http"
        return f"{scheme}://{self.connect_host}:{self.metrics_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def agentd_command(args: Sequence[str]) -> list[str]:
    """The command line that runs agentd from this checkout with ``args``."""
    return [sys.executable, "-m", "agentd.cli", *args]


def healthz_status(host: str, port: int, timeout: float = 2.0,
                   tls_ca: pathlib.Path | None = None) -> int | None:
    """HTTP status of ``/healthz`` (HTTPS trusting ``tls_ca`` when given), None while nothing answers."""
    if tls_ca is None:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        context = ssl.create_default_context(cafile=str(tls_ca))
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def write_token(directory: pathlib.Path, token: str) -> pathlib.Path:
    """A token file with mode 0600, as agentd requires."""
    path = directory / "agentd-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def running_agent(
    tmp_path: pathlib.Path,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    token: str | None = None,
    interval_ms: int = 200,
    env: dict[str, str] | None = None,
    tls: tuple[pathlib.Path, pathlib.Path] | None = None,
) -> Iterator[RunningAgent]:
    """An agentd subprocess that answers /healthz; terminated (then killed) on exit.

    ``token`` writes a 0600 token file and passes ``--token-file``. ``tls`` is a
    (certificate, key) pair for ``--tls-cert/--tls-key``. ``env`` replaces the
    environment (default: this process's, without $TUIPROF_TOKEN).
    """
    port = free_port("0.0.0.0")  # free on the wildcard: free on every address
    metrics_port = free_port("0.0.0.0")
    while metrics_port == port:
        metrics_port = free_port("0.0.0.0")
    directory = pathlib.Path(tmp_path) / f"agentd-{host}-{port}"
    directory.mkdir(parents=True)
    trace_dir = directory / "traces"
    args = ["--host", host, "--port", str(port), "--metrics-port", str(metrics_port),
            "--interval-ms", str(interval_ms), "--trace-dir", str(trace_dir), *extra_args]
    if token is not None:
        args += ["--token-file", str(write_token(directory, token))]
    if tls is not None:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    log_path = directory / "agentd.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(agentd_command(args), stdout=subprocess.DEVNULL,
                                   stderr=log_file, env=env)
    agent = RunningAgent(process, host, port, metrics_port, token, trace_dir, log_path,
                         tls[0] if tls is not None else None)
    try:
        _wait_healthy(agent)
        yield agent
    finally:
        stop_process(process)


def _wait_healthy(agent: RunningAgent) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if agent.process.poll() is not None:
            raise AgentStartError(
                f"agentd exited with {agent.process.returncode} before serving:\n{agent.log()}"
            )
        if healthz_status(agent.connect_host, agent.metrics_port, tls_ca=agent.tls_cert) == 200:
            return
        time.sleep(0.05)
    raise AgentStartError(f"agentd not healthy after {START_TIMEOUT_SECONDS} s:\n{agent.log()}")


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_SECONDS; returns the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(STOP_TIMEOUT_SECONDS)


# ---------------------------------------------------------------- tiny collectors
# For tests of the agent machinery itself (scheduling, failures, slow watchers),
# where the real collectors' data would only add noise. Register them by entry:
# ``Daemon(config, collectors=["testkit.agents:TickCollector"])``.


class TickCollector(Collector):
    """Counts its own samples; fills the count as ``cpu.process_count`` (a visible integer)."""

    name = "tick"

    def __init__(self, interval_seconds: float) -> None:
        super().__init__(interval_seconds)
        self.samples = 0
        self.fail_collect: str | None = None
        self.fail_fill = False
        self.closed = False
        self._lock = threading.Lock()

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=True)

    def collect(self) -> None:
        if self.fail_collect is not None:
            raise OSError(self.fail_collect)
        with self._lock:
            self.samples += 1

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        snapshot.cpu.load1 = 1.0  # written before failing: must not leak into the snapshot
        if self.fail_fill:
            raise ValueError("fill broke")
        with self._lock:
            snapshot.cpu.process_count = self.samples

    def close(self) -> None:
        self.closed = True


class FatCollector(Collector):
    """Fills 200 NICs with long names (~20 KB a snapshot) to fill HTTP/2 windows fast."""

    name = "fat"

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=True)

    def collect(self) -> None:
        """Nothing to sample: the content is fixed."""

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        for index in range(200):
            snapshot.nics.add(name=f"fat-nic-{index:04d}-" + "x" * 64, rx_bytes_total=index)


class AbsentCollector(Collector):
    """A collector that cannot work here, like a GPU collector without a driver."""

    name = "absent"

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=False, reason="no such device here")

    def collect(self) -> None:
        raise AssertionError("an unavailable collector must never be sampled")

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        raise AssertionError("an unavailable collector must never fill")
