"""Containers made with unshare(1), as Docker, a Kubernetes pod or enroot make them for a rank:
their own pid, mount, network, IPC and UTS namespaces, loopback up, /proc and a private tmpfs on
/dev/shm of their own, a cgroup named as Docker names a container's, and optionally a user namespace
in which the container's root is an unprivileged host uid (a rootless container) or a private /tmp.

    with Container.create() as box:
        job = box.popen([PYTHON, "-m", "tuiprof", "run", ...])   # pid 2, 3, ... inside
        box.host_pids()                                          # what the host's agent sees

Made and torn down as every namespace of the test kit is (``testkit/namespaces.py``: ``held``); its
sleeper is the container's pid 1. ``popen``/``run`` enter it with ``nsenter`` as ``docker exec`` does
(``-p`` forks: a Popen's pid is nsenter's, ``host_pid_of``/``host_pids`` find the container's
processes). Needs root, unshare/nsenter/setpriv (util-linux) and ip (iproute2): ``unavailable_reason``
in ``testkit/namespaces.py`` with ``user_name=None``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psutil

from testkit.namespaces import NEEDED_BY_OTHERS, Holder, User, held, sleeping_shell, traversal_view

SHM_BYTES = 64 << 20  # the container's own /dev/shm (Docker's default --shm-size)
CGROUP_PARENT = "/sys/fs/cgroup/pids/docker"  # a cgroup v1 hierarchy on this project's VMs; v2: below
CGROUP_V2_PARENT = "/sys/fs/cgroup/system.slice"
TMP_KEEP = "/run/tpkeep"  # where the needed folders under /tmp are held while /tmp is covered


@dataclasses.dataclass
class Container:
    """A container: the namespaces its pid 1 (``holder``) holds, its id and cgroup, the user of a rootless one."""

    holder: Holder
    id: str  # 64 hex digits, as Docker's
    cgroup: pathlib.Path | None
    user: User | None  # the host uid its root is, for a rootless container

    @property
    def init_pid(self) -> int:
        """The host pid of the container's pid 1."""
        return self.holder.pid

    @classmethod
    @contextlib.contextmanager
    def create(cls, rootless_as: User | None = None, shared_shm: bool = False, shm_link_to: str | None = None,
               private_tmp: bool = False, docker_cgroup: bool = True) -> Iterator[Container]:
        """``shared_shm``: the host's /dev/shm, as ``docker run --ipc=host`` gives; ``shm_link_to``: a
        hostile container's /dev/shm, a link to that path (on a tmpfs over /dev); ``private_tmp``: a tmpfs
        on /tmp (``docker run --tmpfs /tmp``), this checkout and interpreter kept at their paths if they are
        under it; ``docker_cgroup`` False: it stays in its creator's cgroup, as plain unshare leaves it."""
        if shm_link_to is not None:
            shm = ["mount -t tmpfs -o mode=0755 tmpfs /dev", f"ln -s {shlex.quote(shm_link_to)} /dev/shm"]
        else:
            shm = [] if shared_shm else [f"mount -t tmpfs -o size={SHM_BYTES},mode=1777 tmpfs /dev/shm"]
        inside = ["mount -t proc proc /proc", *shm, "ip link set lo up", "hostname container"]
        container = ["unshare", "--pid", "--fork", "--mount", "--net", "--ipc", "--uts", "--propagation", "private",
                     "--", *sleeping_shell(inside)]
        if rootless_as is not None:  # its root is the user's uid: the user makes the user namespace
            container = [*rootless_as.become(), "unshare", "--user", "--map-root-user", *container[1:]]
        # An outer mount namespace, as root: the private /tmp, and this checkout and interpreter made reachable
        # to the other user; the container's own mount namespace starts as a copy of it.
        outer = [*(private_tmp_steps(NEEDED_BY_OTHERS) if private_tmp else []),
                 *(traversal_view(NEEDED_BY_OTHERS) if rootless_as is not None else []),
                 f"exec {shlex.join(container)}"]
        container_id = secrets.token_hex(32)
        cgroup = _cgroup_folder(container_id, rootless_as) if docker_cgroup else None
        try:
            with held(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                       " && ".join(outer)]) as holder:
                box = cls(holder, container_id, cgroup, rootless_as)
                box.join_cgroup(holder.pid)
                yield box
        finally:
            if cgroup is not None:
                _remove_cgroup(cgroup)

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside as the container's root (in a rootless one, the user enters their own
        user namespace first, whose root they are)."""
        user = [*self.user.become(), "nsenter", "-U", "--preserve-credentials"] if self.user is not None else ["nsenter"]
        # The command moves itself into the container's cgroup first, so all it starts is in it too.
        join = ["sh", "-c", f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"', "sh"] if self.cgroup else []
        return [*user, "-t", str(self.init_pid), "-p", "-m", "-n", "-i", "-u", "--", *join,
                *[str(part) for part in command]]

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(self.argv(command), **kwargs)

    def run(self, command: Sequence[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout, **kwargs)

    def join_cgroup(self, host_pid: int) -> None:
        """Put a process (and so what it starts) in the container's cgroup."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(host_pid))

    def host_pids(self) -> dict[int, int]:
        """Every process in the container: its host pid → its pid inside."""
        namespace = self.holder.namespace("pid")
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.stat(f"/proc/{name}/ns/pid").st_ino == namespace:
                    found[int(name)] = self.pid_inside(int(name))
        return found

    def host_pid_of(self, entered: subprocess.Popen, program: str, marker: str, timeout: float = 30) -> int:
        """The host pid of the process under ``entered`` (an nsenter) running ``program`` (its argv[0]) with
        ``marker`` in its command line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for child in psutil.Process(entered.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    argv = child.cmdline()
                    if argv[:1] == [program] and any(marker in part for part in argv):
                        return child.pid
            time.sleep(0.1)
        raise AssertionError(f"no process with {marker!r} under {entered.pid}")

    @staticmethod
    def pid_inside(host_pid: int) -> int:
        """``host_pid`` as the container numbers it (the last NSpid)."""
        with open(f"/proc/{host_pid}/status") as status:
            line = next(line for line in status if line.startswith("NSpid:"))
        return int(line.split()[-1])


def private_tmp_steps(needed: Sequence[pathlib.Path]) -> list[str]:
    """Shell steps that put a private tmpfs on /tmp, the ``needed`` folders under it (a checkout or
    interpreter in /tmp) held across and bound back at their own paths."""
    under_tmp = [path for path in dict.fromkeys(needed) if pathlib.Path("/tmp") in path.parents]
    held_at = [(path, f"{TMP_KEEP}{n}") for n, path in enumerate(under_tmp)]
    steps = [step for path, keep in held_at
             for step in (f"mkdir -p {keep}", f"mount --bind {shlex.quote(str(path))} {keep}")]
    steps.append("mount -t tmpfs -o mode=1777 tmpfs /tmp")
    steps += [step for path, keep in held_at
              for step in (f"mkdir -p {shlex.quote(str(path))}", f"mount --bind {keep} {shlex.quote(str(path))}")]
    return steps


def _cgroup_folder(container_id: str, owner: User | None) -> pathlib.Path | None:
    """A cgroup named as Docker names a container's (``docker/<id>`` on cgroup v1, ``docker-<id>.scope``
    on v2), created (and delegated to ``owner``, as systemd does for a rootless container); None when
    neither hierarchy takes one here."""
    for folder in (pathlib.Path(CGROUP_PARENT) / container_id,
                   pathlib.Path(CGROUP_V2_PARENT) / f"docker-{container_id}.scope"):
        try:
            folder.mkdir(parents=True)
        except OSError:
            continue
        if (folder / "cgroup.procs").exists():
            if owner is not None:
                for path in (folder, folder / "cgroup.procs"):
                    os.chown(path, owner.uid, owner.gid)
            return folder
        folder.rmdir()
    return None


def _remove_cgroup(cgroup: pathlib.Path) -> None:
    """Kill what is left in the cgroup, then remove it."""
    for pid in (cgroup / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            os.kill(int(pid), 9)
    with contextlib.suppress(OSError):
        cgroup.rmdir()
