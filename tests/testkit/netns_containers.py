"""A container made with util-linux ``unshare``: its own pid, mount, network, IPC and UTS namespaces,
loopback up, private tmpfs on /dev/shm and /tmp (the agent's trace dir is not visible inside; this
checkout and its interpreter are, wherever they are, also to other users).

    with NetnsContainer.create() as box:
        process = box.popen(["sh", "-c", "exec python trainer.py"])   # nsenter: a child inside
        host_pid = box.host_pid_of(process, "trainer.py")

What runs inside is entered with ``nsenter --target <init> -p -m -n -i -u`` (as ``docker exec``): nsenter
forks, so the command is a child of the nsenter process, and its parent outside the container is pid 0 to
it. Needs root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence

import psutil

from testkit.namespaces import NEEDED_BY_OTHERS, traversal_view

SHM_BYTES = 8 << 20


def private_tmp(needed: Sequence[pathlib.Path]) -> list[str]:
    """Shell steps that put a private tmpfs on /tmp, the ``needed`` folders under it (a checkout or
    interpreter in /tmp) held across and bound back at their own paths."""
    under_tmp = [path for path in dict.fromkeys(needed) if pathlib.Path("/tmp") in path.parents]
    held = [(path, f"/run/tpkeep{n}") for n, path in enumerate(under_tmp)]
    steps = [step for path, keep in held for step in (f"mkdir -p {keep}", f"mount --bind {shlex.quote(str(path))} {keep}")]
    steps.append("mount -t tmpfs -o mode=1777 tmpfs /tmp")
    steps += [step for path, keep in held
              for step in (f"mkdir -p {shlex.quote(str(path))}", f"mount --bind {keep} {shlex.quote(str(path))}")]
    return steps


@dataclasses.dataclass
class NetnsContainer:
    holder: subprocess.Popen[bytes]  # `unshare`, outside; its child is the container's pid 1
    init_pid: int  # the container's pid 1, as the host numbers it

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[NetnsContainer]:
        setup = " && ".join(["ip link set lo up", f"mount -t tmpfs -o size={SHM_BYTES},mode=1777 tmpfs /dev/shm",
                             *private_tmp(NEEDED_BY_OTHERS), *traversal_view(NEEDED_BY_OTHERS), "echo ready",
                             "exec sleep infinity"])
        holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--net", "--ipc", "--uts",
                                   "--propagation", "private", "--", "sh", "-c", setup], stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None
            if holder.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"container setup failed (exit {holder.wait(10)})")
            [init] = psutil.Process(holder.pid).children()
        except BaseException:
            holder.kill()
            holder.wait(10)
            raise
        try:
            yield cls(holder, init.pid)
        finally:
            init.kill()  # the end of a pid namespace's init ends every process in it
            holder.wait(10)

    def argv(self, command: Sequence[str], user: tuple[int, int] | None = None) -> list[str]:
        prefix = ["nsenter", "--target", str(self.init_pid), "-p", "-m", "-n", "-i", "-u", "--"]
        if user is not None:
            prefix += ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
        return prefix + [str(part) for part in command]

    def popen(self, command: Sequence[str], user: tuple[int, int] | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(command, user), **kwargs)

    def run(self, command: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout)

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

    def network_namespace(self) -> int:
        return os.stat(f"/proc/{self.init_pid}/ns/net").st_ino
