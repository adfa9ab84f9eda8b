"""``--slurm-job`` against a real SLURM cluster (munged, slurmctld, three slurmd) on this machine."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from console.prometheus_server import PROMETHEUS, named_agent, running_prometheus
from testkit.agents import running_agent
from testkit.ports import free_port
from testkit.slurm import SlurmCluster, slurm_cluster, unavailable_reason
from testkit.terminal import tmux_environment
from tuiprof.client.slurm import (
    JobNotRunningError,
    SlurmCommandError,
    SlurmNotInstalledError,
    UnknownJobError,
    hosts_for_job,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with slurm_cluster(node_count=3) as running:
        yield running


@pytest.fixture(scope="module")
def two_node_job(cluster: SlurmCluster) -> Iterator[str]:
    """A job running on tpnode1 and tpnode3 (a node list SLURM folds as tpnode[1,3])."""
    job_id = cluster.submit("-N2", "--nodelist=tpnode1,tpnode3", "--wrap", "sleep 300")
    cluster.wait_for_state(job_id, {"RUNNING"})
    yield job_id
    cluster.tool("scancel", job_id)


def test_running_job_resolves_to_its_nodes(two_node_job: str) -> None:
    assert hosts_for_job(two_node_job) == ["tpnode1", "tpnode3"]


def test_unknown_job_is_a_clear_error(cluster: SlurmCluster) -> None:
    with pytest.raises(UnknownJobError, match=r"SLURM does not know job 987654 \(squeue: .*Invalid job id"):
        hosts_for_job("987654")


def test_pending_job_is_a_clear_error(cluster: SlurmCluster) -> None:
    job_id = cluster.submit("--hold", "--wrap", "true")
    try:
        with pytest.raises(JobNotRunningError, match=rf"job {job_id} is not running \(PENDING, reason JobHeldUser\)"):
            hosts_for_job(job_id)
    finally:
        cluster.tool("scancel", job_id)


def test_completed_job_is_a_clear_error(cluster: SlurmCluster) -> None:
    job_id = cluster.submit("--wrap", "true")
    cluster.wait_for_state(job_id, {"COMPLETED"})
    with pytest.raises(JobNotRunningError, match=rf"job {job_id} is not running \(COMPLETED\).*pick a running job"):
        hosts_for_job(job_id)


def test_controller_down_shows_squeue_stderr(
    cluster: SlurmCluster, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same cluster's configuration, but naming a controller port nobody listens on.
    lines = [
        f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
        for line in cluster.conf.read_text().splitlines()
    ]
    down = tmp_path / "slurm.conf"
    down.write_text("\n".join([*lines, "MessageTimeout=2", ""]))
    monkeypatch.setenv("SLURM_CONF", str(down))
    with pytest.raises(SlurmCommandError, match=r"failed \(exit 1\): .*Unable to contact slurm controller.*scontrol ping"):
        hosts_for_job("1")


def test_squeue_that_never_answers_is_cut_off(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("squeue") is None:
        pytest.skip("squeue is not installed: apt-get install slurm-wlm")
    # With no configuration file squeue retries for a minute before giving up.
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(SlurmCommandError, match=r"did not answer within 1 s \(.*missing\.conf"):
        hosts_for_job("1", timeout_s=1)


def test_slurm_not_installed_is_a_clear_error(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmNotInstalledError, match=r"`squeue` is not on PATH.*tuiprof connect HOST"):
        hosts_for_job("4242")


def _tuiprof(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuiprof.cli", *args], capture_output=True, text=True,
        timeout=timeout_s, env=os.environ.copy(), check=False,
    )


@pytest.fixture(scope="module")
def agent_port(
    cluster: SlurmCluster, two_node_job: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """Real agents on the job's nodes, all on one port as on a real cluster.

    Each agent listens only on its node's address, so a client that reaches both
    resolved each node name to its own node.
    """
    port = free_port(cluster.nodes["tpnode1"])
    same_port = ["--port", str(port)]  # overrides the free port running_agent picks
    tmp_path = tmp_path_factory.mktemp("agents")
    with (
        running_agent(tmp_path, host=cluster.nodes["tpnode1"], extra_args=same_port),
        running_agent(tmp_path, host=cluster.nodes["tpnode3"], extra_args=same_port),
    ):
        yield port


def test_status_reaches_the_agents_on_the_jobs_nodes(two_node_job: str, agent_port: int) -> None:
    result = _tuiprof("status", "--slurm-job", two_node_job, "--port", str(agent_port), "--json")
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [(h["host"], h["reachable"], h["error"]) for h in hosts] == [
        (f"tpnode1:{agent_port}", True, None),
        (f"tpnode3:{agent_port}", True, None),
    ]
    assert all(h["cpu"] is not None for h in hosts)


def test_console_in_a_terminal_watches_the_jobs_nodes(
    two_node_job: str, agent_port: int, tmp_path: pathlib.Path
) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: apt-get install tmux")
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    console = [sys.executable, "-m", "tuiprof.cli", "--slurm-job", two_node_job, "--port", str(agent_port)]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "160", "-y", "40", "-e", f"SLURM_CONF={os.environ['SLURM_CONF']}",
         shlex.join(console)],
        check=True, timeout=10, env=tmux_environment(),
    )
    try:
        # Both nodes listed and connected: their agents answered through the node names.
        _wait_for_screen(tmux, ["2/2 hosts up", f"tpnode1:{agent_port}", f"tpnode3:{agent_port}"])
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, timeout=10)


def _wait_for_screen(tmux: list[str], wanted: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
        if all(text in screen for text in wanted):
            return
        time.sleep(0.3)
    raise AssertionError(f"{wanted} not on screen after {timeout_s:g} s:\n{screen}")


def test_status_with_a_job_that_is_not_running_says_why(cluster: SlurmCluster) -> None:
    job_id = cluster.submit("--hold", "--wrap", "true")
    try:
        result = _tuiprof("status", "--slurm-job", job_id, "--json")
    finally:
        cluster.tool("scancel", job_id)
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"job {job_id} is not running (PENDING, reason JobHeldUser)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt package prometheus)")
def test_prometheus_scrapes_the_jobs_nodes_from_prometheus_targets(
    cluster: SlurmCluster, two_node_job: str, tmp_path: pathlib.Path
) -> None:
    """prometheus-targets --slurm-job → file_sd → Prometheus scrapes agents named as the nodes →
    the fleet view of the job from Prometheus: both nodes up, no agent asked by the console."""
    address = cluster.nodes["tpnode1"]
    port, metrics_port = free_port(address), free_port(address)
    targets = tmp_path / "targets.json"
    written = _tuiprof("prometheus-targets", "--slurm-job", two_node_job, "--metrics-port", str(metrics_port),
                       "--output", str(targets))
    assert written.returncode == 0, written.stderr
    assert json.loads(targets.read_text()) == [
        {"targets": [f"tpnode1:{metrics_port}", f"tpnode3:{metrics_port}"], "labels": {}}]
    with (named_agent(tmp_path, "tpnode1", port, metrics_port, cluster.nodes["tpnode1"]),
          running_prometheus(tmp_path, file_sd=targets) as url):
        # tpnode3's agent is not started: the job's node list says it should be there
        deadline = time.monotonic() + 60
        while True:
            result = _tuiprof("status", "--prometheus", url, "--slurm-job", two_node_job, "--port", str(port),
                              "--json")
            hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
            if hosts[f"tpnode1:{port}"]["reachable"] and "up == 0" in (hosts[f"tpnode3:{port}"]["error"] or ""):
                break
            assert time.monotonic() < deadline, hosts
            time.sleep(0.5)
    assert result.returncode == 1  # a node of the job is down
    assert list(hosts) == [f"tpnode1:{port}", f"tpnode3:{port}"]
    assert hosts[f"tpnode1:{port}"]["summary"]["cpu_percent"] is not None
    assert hosts[f"tpnode3:{port}"]["error"].startswith(
        f"Prometheus cannot scrape it (up == 0 for tpnode3:{metrics_port}, job tuiprof")
