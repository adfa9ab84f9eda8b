"""``--slurm-job`` against a real SLURM cluster (munged, slurmctld, three slurmd) on this machine."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testkit.agents import running_agent
from testkit.ports import free_port
from testkit.slurm import SlurmCluster, slurm_cluster, unavailable_reason
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


def test_status_reaches_the_agents_on_the_jobs_nodes(
    cluster: SlurmCluster, two_node_job: str, tmp_path: pathlib.Path
) -> None:
    # One agent port for the whole job, as on a real cluster; each agent listens only on
    # its node's address, so reaching both proves each name resolved to its own node.
    port = free_port(cluster.nodes["tpnode1"])
    same_port = ["--port", str(port)]  # overrides the free port running_agent picks
    with (
        running_agent(tmp_path, host=cluster.nodes["tpnode1"], extra_args=same_port),
        running_agent(tmp_path, host=cluster.nodes["tpnode3"], extra_args=same_port),
    ):
        result = _tuiprof("status", "--slurm-job", two_node_job, "--port", str(port), "--json")
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [(h["host"], h["reachable"], h["error"]) for h in hosts] == [
        (f"tpnode1:{port}", True, None),
        (f"tpnode3:{port}", True, None),
    ]
    assert all(h["cpu"] is not None for h in hosts)


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
