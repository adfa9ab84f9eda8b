"""Containers made with unshare(1), as Docker, a Kubernetes pod or enroot make them for a rank:
their own pid, mount, network, IPC and UTS namespaces, a private tmpfs on /dev/shm, a cgroup of
their own named as Docker names it, and optionally a user namespace in which the container's root
is an unprivileged host uid (a rootless container).

    with Container.create() as box:
        job = box.popen([PYTHON, "-m", "tuiprof", "run", ...])   # pid 2, 3, ... inside
        box.host_pids()                                          # what the host's agent sees

A sleeping process holds the namespaces (pid 1 inside); ``popen``/``run`` enter them with
``nsenter`` (``-p`` forks: a Popen's pid is nsenter's, ``host_pids`` lists the container's
processes). Needs root, unshare/nsenter/setpriv (util-linux) and ip (iproute2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import secrets
import shlex
import subprocess
from collections.abc import Iterator, Sequence

from testkit.namespaces import NEEDED_BY_OTHERS, TOOLS, User, kill_namespace, traversal_view

SHM_BYTES = 64 << 20  # the container's own /dev/shm (Docker's default --shm-size)
CGROUP_PARENT = "/sys/fs/cgroup/pids/docker"  # a cgroup v1 hierarchy on this project's VMs; v2: below
CGROUP_V2_PARENT = "/sys/fs/cgroup/system.slice"


def unavailable_reason() -> str | None:
    """Why containers cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root: the container tests make namespaces and cgroups and run the agent as root"
    missing = [tool for tool in TOOLS if not any(os.access(os.path.join(d, tool), os.X_OK)
                                                  for d in os.environ.get("PATH", "").split(":"))]
    return f"needs {', '.join(missing)} (util-linux, iproute2)" if missing else None


def _cgroup_folder(container_id: str) -> pathlib.Path | None:
    """A cgroup named as Docker names a container's (``docker/<id>`` on cgroup v1, ``docker-<id>.scope``
    on v2), created; None when neither hierarchy takes one here."""
    for folder in (pathlib.Path(CGROUP_PARENT) / container_id,
                   pathlib.Path(CGROUP_V2_PARENT) / f"docker-{container_id}.scope"):
        try:
            folder.mkdir(parents=True)
        except OSError:
            continue
        if (folder / "cgroup.procs").exists():
            return folder
        folder.rmdir()
    return None


@dataclasses.dataclass
class Container:
    """The namespaces held by ``holder`` (an unshare whose forked child is the container's pid 1)."""

    holder: subprocess.Popen[bytes]
    init_pid: int  # host pid of the container's pid 1
    id: str  # 64 hex digits, as Docker's
    cgroup: pathlib.Path | None
    user: User | None  # the host uid its root is, for a rootless container

    @classmethod
    @contextlib.contextmanager
    def create(cls, rootless_as: User | None = None, shared_shm: bool = False,
               shm_link_to: str | None = None) -> Iterator[Container]:
        """``shared_shm``: the host's /dev/shm, as ``docker run --ipc=host`` gives; ``shm_link_to``: a
        hostile container's /dev/shm, a link to that path (on a tmpfs over /dev)."""
        if shm_link_to is not None:
            shm = ["mount -t tmpfs -o mode=0755 tmpfs /dev", f"ln -s {shlex.quote(shm_link_to)} /dev/shm"]
        else:
            shm = [] if shared_shm else [f"mount -t tmpfs -o size={SHM_BYTES},mode=1777 tmpfs /dev/shm"]
        inside = " && ".join(["mount -t proc proc /proc", *shm, "ip link set lo up", "hostname container",
                              "echo ready", "exec sleep infinity"])
        container = ["unshare", "--pid", "--fork", "--mount", "--net", "--ipc", "--uts", "--propagation", "private",
                     "--", "sh", "-c", inside]
        if rootless_as is not None:  # its root is the user's uid: the user makes the user namespace
            container = [*rootless_as.become(), "unshare", "--user", "--map-root-user", *container[1:]]
        # An outer mount namespace makes this checkout and interpreter reachable to the other user.
        outer = " && ".join([*(traversal_view(NEEDED_BY_OTHERS) if rootless_as is not None else []),
                             f"exec {shlex.join(container)}"])
        holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", outer],
                                  stdout=subprocess.PIPE)
        box: Container | None = None
        try:
            assert holder.stdout is not None
            if holder.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"container setup failed (exit {holder.wait(10)})")
            init_pid = _container_init(holder.pid)
            container_id = secrets.token_hex(32)
            cgroup = _cgroup_folder(container_id)
            if cgroup is not None and rootless_as is not None:  # delegated to the user, as systemd does
                for path in (cgroup, cgroup / "cgroup.procs"):
                    os.chown(path, rootless_as.uid, rootless_as.gid)
            box = cls(holder, init_pid, container_id, cgroup, rootless_as)
            box.join_cgroup(init_pid)
            yield box
        finally:
            if box is not None:  # while its pid 1 keeps the namespace's inode
                kill_namespace(os.stat(f"/proc/{box.init_pid}/ns/mnt").st_ino)
            holder.kill()
            holder.wait(10)
            if box is not None:
                box.remove_cgroup()

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside as the container's root (in a rootless one, the user enters their own
        user namespace first, whose root they are)."""
        user = [*self.user.become(), "nsenter", "-U", "--preserve-credentials"] if self.user is not None else ["nsenter"]
        # The command moves itself into the container's cgroup first, so all it starts is in it too.
        join = ["sh", "-c", f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"', "sh"] if self.cgroup else []
        return [*user, "-t", str(self.init_pid), "-p", "-m", "-n", "-i", "-u", "--", *join,
                *[str(part) for part in command]]

    def popen(self, command: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(command), **kwargs)

    def run(self, command: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout, **kwargs)

    def join_cgroup(self, host_pid: int) -> None:
        """Put a process (and so what it starts) in the container's cgroup."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(host_pid))

    def host_pids(self) -> dict[int, int]:
        """Every process in the container: its host pid → its pid inside."""
        namespace = os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}/ns/pid").st_ino != namespace:
                    continue
                status = pathlib.Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:]
            found[int(name)] = int(nspid[-1])
        return found

    def remove_cgroup(self) -> None:
        if self.cgroup is None:
            return
        for pid in (self.cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()


def _container_init(unshare_pid: int) -> int:
    """The host pid of the container's pid 1: the forked child of the (inner) unshare."""
    for _ in range(3):  # outer unshare → sh → [setpriv →] unshare → child
        children = pathlib.Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        if not children:
            raise RuntimeError(f"process {unshare_pid} has no child: the container did not start")
        child = int(children[0])
        status = pathlib.Path(f"/proc/{child}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:]
        if nspid[-1] == "1" and len(nspid) > 1:
            return child
        unshare_pid = child
    raise RuntimeError("the container's pid 1 was not found")
