"""``agentd.containers``: where a process runs, from its cgroup path and namespaces (issue 28 item 3).

The parser is checked on cgroup lines real runtimes wrote (``data/cgroups.txt``, each with its
source); then on this machine, a process put into a cgroup made the way Docker's and kubelet's cgroupfs
drivers make them (cgroup v1, as root), and one in a pid and mount namespace of its own (unshare).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentd import containers
from agentd.collectors.readings import Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.containers import Container
from testkit.namespaces import unavailable_reason

CASES = pathlib.Path(__file__).parent / "data" / "cgroups.txt"
PIDS_HIERARCHY = pathlib.Path("/sys/fs/cgroup/pids")  # a cgroup v1 controller's mount


@dataclass(frozen=True)
class Case:
    title: str
    expected: dict[str, str]  # Container fields; empty: the lines name nothing
    text: str


def _cases() -> list[Case]:
    cases = []
    for block in CASES.read_text().split("\n\n"):
        lines = block.strip().splitlines()
        expect = next((line for line in lines if line.startswith("expect:")), None)
        if expect is None:
            continue  # the file's header
        words = expect.removeprefix("expect:").split()
        expected = {} if words == ["none"] else dict(word.split("=", 1) for word in words)
        cgroup = [line for line in lines if not line.startswith(("#", "expect:"))]
        cases.append(Case(lines[0].lstrip("# "), expected, "\n".join(cgroup) + "\n"))
    return cases


def _fields(container: pb.Container | None) -> dict[str, str]:
    return {} if container is None else {field.name: value for field, value in container.ListFields()}


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case.title.split(" -- ")[0])
def test_real_cgroup_lines(case: Case) -> None:
    assert _fields(containers.container_from_cgroup(case.text)) == case.expected


def test_the_data_file_covers_every_runtime_and_slurm() -> None:
    runtimes = {case.expected.get("runtime") for case in _cases()}
    assert runtimes >= {"docker", "containerd", "cri-o", "podman", "kubepods", "slurm", None}


ID_A, ID_B = "a" * 64, "b" * 64


def test_nothing_below_a_containers_own_cgroup_is_taken() -> None:
    """A container with cgroups of its own names what lies below its cgroup: that is never read."""
    nested = f"0::/system.slice/docker-{ID_A}.scope/docker-{ID_B}.scope/slurm/uid_0/job_5/step_0\n"
    assert _fields(containers.container_from_cgroup(nested)) == {"runtime": "docker", "id": ID_A}


def test_slurm_built_for_multiple_slurmds() -> None:
    """slurmd built with --enable-multiple-slurmd names its cgroups after the node (slurm_<node> in v1,
    <node>_slurmstepd.scope in v2: https://github.com/treydock/cgroup_exporter/issues/30)."""
    v1 = "4:memory:/slurm_node07/uid_1000/job_42/step_batch/task_0\n"
    v2 = "0::/system.slice/node07_slurmstepd.scope/job_42/step_extern/user/task_special\n"
    assert _fields(containers.container_from_cgroup(v1)) == {"runtime": "slurm", "slurm_job_id": "42", "slurm_step": "batch"}
    assert _fields(containers.container_from_cgroup(v2)) == {"runtime": "slurm", "slurm_job_id": "42", "slurm_step": "extern"}


def test_a_runtimes_helpers_are_not_its_containers() -> None:
    """podman's conmon runs in libpod-conmon-<id>.scope beside the container's libpod-<id>.scope."""
    assert containers.container_from_cgroup(f"0::/machine.slice/libpod-conmon-{ID_A}.scope\n") is None


def test_a_pod_is_named_by_kubelets_log_directory() -> None:
    uid = "c101fead-5fa2-4525-97af-5894973b336e"
    names = ["kube-system_coredns-5d78c9869d-abcde_0f0f0f0f-0000-4000-8000-000000000000", f"team-a_trainer-0_{uid}"]
    assert containers.pod_from_log_dirs(names, uid) == ("team-a", "trainer-0")
    assert containers.pod_from_log_dirs(names[:1], uid) is None


# ------------------------------------------------------------ on this machine


@contextlib.contextmanager
def _cgroup(*parts: str) -> Iterator[pathlib.Path]:
    """A cgroup v1 pids cgroup made for the test (each missing level created, then removed)."""
    if os.geteuid() != 0:
        pytest.skip("making cgroups needs root")
    if not (PIDS_HIERARCHY / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v1 pids hierarchy at {PIDS_HIERARCHY}")
    made = []
    path = PIDS_HIERARCHY
    for part in parts:
        path = path / part
        if not path.exists():
            try:
                path.mkdir()
            except OSError as error:
                pytest.skip(f"cannot create the cgroup {path}: {error}")
            made.append(path)
    try:
        yield path
    finally:
        for level in reversed(made):
            level.rmdir()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "HOSTNAME": "trainer-0"})
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_process_in_a_docker_cgroup(sleeper: subprocess.Popen[bytes]) -> None:
    container_id = secrets.token_hex(32)
    with _cgroup("docker", container_id) as cgroup:
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        container = containers.container_of(sleeper.pid)
        assert _fields(container) == {"runtime": "docker", "id": container_id}
        assert containers.pid_in_container(sleeper.pid) == Unavailable(containers.SAME_PID_NAMESPACE)
        sleeper.kill()
        sleeper.wait(10)  # the cgroup must be empty before it is removed


def test_a_process_in_a_kubepods_cgroup_is_named_after_its_hostname(sleeper: subprocess.Popen[bytes]) -> None:
    pod_uid, container_id = str(uuid.uuid4()), secrets.token_hex(32)
    with _cgroup("kubepods", "burstable", f"pod{pod_uid}", container_id) as cgroup:
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        assert _fields(containers.container_of(sleeper.pid)) == {
            "runtime": "kubepods", "id": container_id, "pod_uid": pod_uid, "pod_name": "trainer-0"}
        sleeper.kill()
        sleeper.wait(10)


@pytest.mark.skipif(unavailable_reason(user_name=None) is not None, reason=str(unavailable_reason(user_name=None)))
def test_a_process_in_its_own_pid_and_mount_namespace() -> None:
    with Container.create(docker_cgroup=False) as box:  # in new namespaces, not in a container's cgroup
        inner = box.init_pid
        assert containers.pid_in_container(inner) == 1  # the first process of its pid namespace
        assert _fields(containers.container_of(inner)) == {"own_mount_namespace": True}
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{inner}"):  # reaped by unshare, which dies with it, or by init
        assert time.monotonic() < deadline, f"{inner} outlived its namespace"
        time.sleep(0.01)
    assert containers.pid_in_container(inner) == Unavailable(containers.GONE)
    assert containers.container_of(inner) is None
