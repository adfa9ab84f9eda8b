"""Where a process runs: its container, Kubernetes pod and SLURM job and step, and its pid in there.

The cgroup path (``/proc/<pid>/cgroup``) names them: each runtime puts a process it starts in a
cgroup it names after the container (Docker ``/docker/<id>`` or ``docker-<id>.scope``, containerd
``cri-containerd-<id>.scope``, CRI-O ``crio-<id>.scope``, podman ``libpod-<id>.scope``), kubelet
puts containers under their pod's (``/kubepods/burstable/pod<uid>/<id>`` or, with systemd,
``kubepods-burstable-pod<uid with _ for ->.slice``), and slurmd under the job's and step's
(``/slurm/uid_<u>/job_<id>/step_<s>`` in cgroup v1, ``/system.slice/slurmstepd.scope/job_<id>/step_<s>``
in v2). ``container_from_cgroup`` reads that text and nothing else, so the test suite runs it on
lines real runtimes wrote (``tests/agent/data/cgroups.txt``).

The path is the kernel's, but below a cgroup handed to someone else (a container with cgroups of its
own, a user's systemd) the names are that owner's choice. So the path is read from the root down and
the first container found ends it: what a process names below its container's cgroup is never taken,
and a user can at most name their own processes' cgroups under their own systemd.

Where the names come from, per field: the pod's namespace and name from the directory kubelet keeps
the pod's logs in on this host (``/var/log/pods/<namespace>_<name>_<uid>``, root's, named by kubelet),
else the name from the process's ``HOSTNAME`` (which a Kubernetes container is given as its pod's
name; the agent reads environ as root, as it does for ranks); nothing is read through the process's
root directory (``/proc/<pid>/root``), whose links the container controls.

Everything here is fixed for a process's life (a runtime moves a process into its cgroup before it
runs the program), so the answer is kept per (pid, start time): each later call costs one read of
``/proc/<pid>/stat``.
"""

from __future__ import annotations

import functools
import os
import re
from typing import NamedTuple

from agentd import procfs
from agentd.collectors.readings import Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

POD_LOGS_DIR = "/var/log/pods"  # kubelet's default --pod-logs-dir: <namespace>_<name>_<uid> per pod
SAME_PID_NAMESPACE = "its pid is the host's: it runs in the agent's pid namespace"
GONE = "the process is gone"
_CACHED_PROCESSES = 4096  # far more than the GPU processes and ranks of one host

_ID = r"([0-9a-f]{64})"
# A container's own cgroup, one path component, per runtime (a runtime's helpers, such as podman's
# ``libpod-conmon-<id>.scope``, are not the container and do not match).
_CONTAINER_SCOPES = (
    ("docker", re.compile(rf"docker-{_ID}\.scope")),
    ("containerd", re.compile(rf"cri-containerd-{_ID}\.scope")),
    ("cri-o", re.compile(rf"crio-{_ID}(?:\.scope)?")),
    ("podman", re.compile(rf"libpod-{_ID}(?:\.scope)?")),
)
_BARE_ID = re.compile(_ID)  # cgroupfs drivers: /docker/<id>, /kubepods/<qos>/pod<uid>/<id>
# systemd's spelling in cgroup v1 by runc for containerd: "<pod slice>:cri-containerd:<id>" is one component.
_SLICE_PREFIX_NAME = re.compile(rf"([^:]+):([a-z-]+):{_ID}")
_POD_SLICE = re.compile(r"kubepods(?:-[a-z]+)*-pod([0-9a-f_]+)\.slice")  # systemd: _ for - in the uid
_POD_DIR = re.compile(r"pod([0-9a-f-]+)")  # cgroupfs, below a kubepods component
_SLURM_ROOT = re.compile(r"slurm(?:_.+)?|(?:.+_)?slurmstepd\.scope")  # v1 (multiple-slurmd: slurm_<node>), v2
_SLURM_JOB = re.compile(r"job_(\d+)")
_SLURM_STEP = re.compile(r"step_(\w+)")

KUBEPODS = "kubepods"  # the runtime of a pod's container that kubelet's cgroupfs driver names by id alone
SLURM = "slurm"


class Placement(NamedTuple):
    """What the agent tells of a process's place, kept per (pid, start time)."""

    pid_in_container: int | Unavailable
    container: pb.Container | None


def container_of(pid: int) -> pb.Container | None:
    """Where ``pid`` runs (container, pod, SLURM job), None outside any of them or when gone.

    The message is shared with later callers: copy it (``CopyFrom``), never change it.
    """
    place = _placement(pid)
    return None if place is None else place.container


def pid_in_container(pid: int) -> int | Unavailable:
    """``pid``'s pid in its own pid namespace (what getpid() returns in its container), or why there is none."""
    place = _placement(pid)
    return Unavailable(GONE) if place is None else place.pid_in_container


def short_id(container_id: str) -> str:
    """A container's id as ``docker ps`` and ``crictl ps`` show it: its first 12 hex digits ("" for none)."""
    return container_id[:12]


def container_from_cgroup(text: str) -> pb.Container | None:
    """The container, pod and SLURM job a ``/proc/<pid>/cgroup`` text names; None when it names none.

    cgroup v1 lists one line per hierarchy and they may differ (slurmd constrains only some
    controllers; systemd's own ``name=systemd`` line often says less): the line that tells the most
    is taken, the first of equals.
    """
    best: pb.Container | None = None
    best_fields = 0
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = _container_from_path(parts[2])
        fields = len(found.ListFields())
        if fields > best_fields:
            best, best_fields = found, fields
    return best


def _container_from_path(path: str) -> pb.Container:
    """One cgroup path read from the root down; the first container's own cgroup ends it."""
    found = pb.Container()
    parent = ""  # the component before, for the cgroupfs drivers' bare ids
    under_kubepods = under_slurm = False
    for component in _components(path):
        container = _container_scope(component) or _bare_container(component, parent, under_kubepods)
        if container is not None:
            found.runtime, found.id = container
            break
        if under_slurm and not found.slurm_job_id and (job := _SLURM_JOB.fullmatch(component)):
            found.slurm_job_id = job.group(1)
        elif found.slurm_job_id and not found.slurm_step and (step := _SLURM_STEP.fullmatch(component)):
            found.slurm_step = step.group(1)
        elif _SLURM_ROOT.fullmatch(component):
            under_slurm = True
        elif pod := _POD_SLICE.search(component):
            found.pod_uid = pod.group(1).replace("_", "-")
        elif under_kubepods and (pod := _POD_DIR.fullmatch(component)):
            found.pod_uid = pod.group(1)
        under_kubepods = under_kubepods or KUBEPODS in component
        parent = component
    if not found.runtime:
        found.runtime = KUBEPODS if found.pod_uid else SLURM if found.slurm_job_id else ""
    return found


def _container_scope(component: str) -> tuple[str, str] | None:
    """(runtime, id) when ``component`` is a container's own cgroup as a runtime names it."""
    for runtime, scope in _CONTAINER_SCOPES:
        if match := scope.fullmatch(component):
            return runtime, match.group(1)
    return None


def _bare_container(component: str, parent: str, under_kubepods: bool) -> tuple[str, str] | None:
    """(runtime, id) for the cgroupfs drivers' spelling: a bare id below ``docker`` or a kubepods pod."""
    if not _BARE_ID.fullmatch(component):
        return None
    if parent == "docker":
        return "docker", component
    if under_kubepods and _POD_DIR.fullmatch(parent):
        return KUBEPODS, component
    return None


def _components(path: str) -> list[str]:
    """The path's components, with systemd's ``slice:prefix:name`` spelling as the two it stands for."""
    components = []
    for component in path.strip().split("/"):
        if match := _SLICE_PREFIX_NAME.fullmatch(component):
            components += [match.group(1), f"{match.group(2)}-{match.group(3)}.scope"]
        elif component:
            components.append(component)
    return components


def pod_from_log_dirs(names: list[str], pod_uid: str) -> tuple[str, str] | None:
    """(namespace, name) of the pod ``pod_uid`` among kubelet's pod log directory names
    (``<namespace>_<name>_<uid>``: Kubernetes names hold no ``_``); None when none is the pod's."""
    for entry in names:
        parts = entry.split("_")
        if len(parts) == 3 and parts[2] == pod_uid:
            return parts[0], parts[1]
    return None


def _pod_names(pid: int, pod_uid: str) -> tuple[str, str]:
    """(namespace, name) of the pod, each "" when this host does not tell it."""
    try:
        logged = pod_from_log_dirs(os.listdir(POD_LOGS_DIR), pod_uid)
    except OSError:  # no kubelet here, or its logs elsewhere
        logged = None
    if logged is not None:
        return logged
    hostname = procfs.read_environ(pid).get("HOSTNAME", "")
    # A pod on the host's network has the node's hostname, not its own name.
    return "", ("" if hostname == os.uname().nodename else hostname)


@functools.cache
def _agent_mount_namespace() -> int | None:
    return procfs.namespace_inode(os.getpid(), "mnt")


def _placement(pid: int) -> Placement | None:
    stat = procfs.read_stat(pid)
    return None if stat is None else _placement_at(pid, stat.start_ns)


@functools.lru_cache(maxsize=_CACHED_PROCESSES)
def _placement_at(pid: int, start_ns: int) -> Placement | None:
    """What /proc tells of the process ``pid`` that started at ``start_ns``; None when it is gone."""
    pids = procfs.ns_pids(pid)
    try:
        cgroup = procfs.read_whole(f"/proc/{pid}/cgroup").decode(errors="replace")
    except OSError:
        return None
    if pids is None:
        return None
    container = container_from_cgroup(cgroup) or pb.Container()
    mount_namespace = procfs.namespace_inode(pid, "mnt")
    container.own_mount_namespace = mount_namespace is not None and mount_namespace != _agent_mount_namespace()
    if container.pod_uid:
        namespace, name = _pod_names(pid, container.pod_uid)
        container.pod_namespace, container.pod_name = printable(namespace), printable(name)
    in_container = pids[-1] if len(pids) > 1 else Unavailable(SAME_PID_NAMESPACE)
    return Placement(in_container, container if container.ListFields() else None)
