"""Private namespaces made with unshare(1), and a second real user to run things in them as.

    with Namespace.create() as ns:                                   # mount + network
        agent = ns.popen([AGENTD, "--port", "1779", ...])           # root, inside
        ns.run([PYTHON, "client.py", "info"], user=hostile)         # the other user, inside

Every set of namespaces here, a ``Namespace`` or a container (``testkit/containers.py``), is made
one way: ``held`` runs an ``unshare`` whose last process sets them up, prints ``ready`` and sleeps
(``sleeping_shell``); that sleeper holds them, ``nsenter -t <sleeper>`` enters them, and on the way
out every process of its mount namespace is killed. ``wait_ready`` is how a test waits for any
process of its own that prints ``ready``.

A ``Namespace`` has its own mount and network namespaces (loopback up, a small /dev/shm of its own)
and no pid namespace: ``nsenter -m -n`` (and ``setpriv`` for the other user) exec the command, so a
``Popen``'s pid is the command's own. Needs root (unshare, mount, nsenter, setpriv from util-linux;
ip from iproute2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

HOSTILE_USER = "tuiprof-hostile"
SHM_BYTES = 8 << 20  # the namespace's own /dev/shm
REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("unshare", "nsenter", "setpriv", "ip", "mount")


# What the other user runs: this checkout (its code, the virtual environment in it) and the interpreter
# the environment was made from (its standard library).
NEEDED_BY_OTHERS = (REPO, pathlib.Path(os.path.realpath(sys.executable)).parents[1],
                    pathlib.Path(os.path.realpath(sys.base_prefix)))
VIEW_KEEP = "/mnt"  # where the needed folders are held while their blocking parent is covered


def blocking_parent(path: pathlib.Path) -> pathlib.Path | None:
    """The first folder above ``path`` that other users cannot pass through (no o+x), None when there is none."""
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def traversal_view(paths: Sequence[pathlib.Path]) -> list[str]:
    """Shell steps, run in the namespace's own mount namespace, after which every one of ``paths`` is
    reachable by other users at its own path: a folder above it that others cannot pass (root's 0700
    home, where a checkout or pyenv may live) is covered by a 0711 tmpfs holding just those paths
    (bind mounts), so a checkout anywhere works and nothing else of that folder shows."""
    covered: dict[pathlib.Path, list[pathlib.Path]] = {}
    for path in dict.fromkeys(paths):
        parent = blocking_parent(path)
        if parent is not None:
            covered.setdefault(parent, []).append(path)
    if not covered:
        return []
    steps = [f"mount -t tmpfs -o mode=0700 tmpfs {VIEW_KEEP}"]
    held = [(path, f"{VIEW_KEEP}/{n}") for n, path in enumerate(p for paths in covered.values() for p in paths)]
    for path, keep in held:
        steps += [f"mkdir {keep}", f"mount --bind {shlex.quote(str(path))} {keep}"]
    for parent in covered:
        steps.append(f"mount -t tmpfs -o mode=0711 tmpfs {shlex.quote(str(parent))}")
    for path, keep in held:
        steps += [f"mkdir -p -m 0711 {shlex.quote(str(path))}", f"mount --bind {keep} {shlex.quote(str(path))}"]
    return steps


@dataclasses.dataclass(frozen=True)
class User:
    """A real unprivileged account (from the password database)."""

    name: str
    uid: int
    gid: int

    @classmethod
    def lookup(cls, name: str) -> User:
        entry = pwd.getpwnam(name)
        return cls(name, entry.pw_uid, entry.pw_gid)

    def become(self) -> list[str]:
        """The argv prefix that runs a command as this user with no supplementary groups."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]


def unavailable_reason(user_name: str | None = HOSTILE_USER) -> str | None:
    """Why namespaces cannot be made here, or the second real user ``user_name`` is missing (None: the
    tests can run; ``user_name`` None: no second user needed)."""
    if os.geteuid() != 0:
        return "needs root: the tests make namespaces and run the agent as root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (util-linux, iproute2)"
    if user_name is None:
        return None
    try:
        pwd.getpwnam(user_name)
    except KeyError:
        return (f"no user {user_name!r}: tests/run.sh creates it as root "
                f"(useradd -M -s /usr/sbin/nologin {user_name})")
    return None


def wait_ready(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """``process`` once it printed ``ready`` (killed, with its exit status and the end of its stderr in the
    failure, otherwise)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        stderr = process.communicate(timeout=10)[1] or ""
        raise AssertionError(f"did not start (exit {process.returncode}): {line!r} {stderr[-2000:]}")
    return process


def kill_namespace(mount_namespace: int) -> None:
    """Kill every process in a mount namespace (a test's rank that outlived it keeps the namespace's
    /dev/shm, and its segment, alive: a root agent of a later test would list it). Call it while a
    process of the namespace still lives: a dead namespace's inode number is reused."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}/ns/mnt").st_ino == mount_namespace:
                    os.kill(int(name), 9)


def sleeping_shell(steps: Sequence[str]) -> list[str]:
    """``sh -c``: the shell ``steps`` that set up new namespaces, then ``ready`` printed and a sleep that holds
    them (the last command ``held`` runs)."""
    return ["sh", "-c", " && ".join([*steps, "echo ready", "exec sleep infinity"])]


@dataclasses.dataclass(frozen=True)
class Holder:
    """The process that holds a set of namespaces: the ``sleeping_shell`` in them (a new pid namespace's
    pid 1), as the host numbers it."""

    pid: int

    def namespace(self, kind: str) -> int:
        """The inode of its ``kind`` namespace (``mnt``, ``net``, ``pid``, ...), which tells namespaces apart."""
        return os.stat(f"/proc/{self.pid}/ns/{kind}").st_ino


@contextlib.contextmanager
def held(command: Sequence[str]) -> Iterator[Holder]:
    """Runs ``command`` (an ``unshare`` that ends in a ``sleeping_shell``) until it is ready; on the way out
    kills every process of its mount namespace, then the command."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            wait_ready(process)
            holder = Holder(_sleeper(process.pid))
            try:
                yield holder
            finally:
                kill_namespace(holder.namespace("mnt"))  # while the sleeper keeps its inode
        finally:
            process.kill()


def _sleeper(pid: int) -> int:
    """The last of ``pid``'s line of first children: the shell that said ready (now the sleep), which
    started nothing; ``pid`` itself where unshare did not fork."""
    while children := pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        pid = int(children[0])
    return pid


@dataclasses.dataclass
class Namespace:
    """Mount + network namespaces; loopback up, private /dev/shm."""

    holder: Holder

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[Namespace]:
        setup = ["ip link set lo up", f"mount -t tmpfs -o size={SHM_BYTES},mode=1777 tmpfs /dev/shm",
                 *traversal_view(NEEDED_BY_OTHERS)]
        with held(["unshare", "--mount", "--net", "--propagation", "private", "--", *sleeping_shell(setup)]) as holder:
            yield cls(holder)

    def link(self, other: Namespace) -> tuple[str, str]:
        """A point-to-point link (veth) to ``other``: (this side's address, the other's), a /30."""
        octet = self.holder.pid % 250 + 1
        mine, theirs = f"10.{octet}.0.1", f"10.{octet}.0.2"
        here, there = f"tpa{self.holder.pid}"[:15], f"tpb{self.holder.pid}"[:15]
        subprocess.run(["ip", "link", "add", here, "netns", str(self.holder.pid), "type", "veth",
                        "peer", "name", there, "netns", str(other.holder.pid)], check=True)
        for ns, device, address in ((self, here, mine), (other, there, theirs)):
            for step in (["ip", "addr", "add", f"{address}/30", "dev", device], ["ip", "link", "set", device, "up"]):
                done = ns.run(step)
                assert done.returncode == 0, done.stderr
        return mine, theirs

    def argv(self, command: Sequence[str], user: User | None = None) -> list[str]:
        prefix = ["nsenter", "-t", str(self.holder.pid), "-m", "-n", "--"]
        if user is not None:
            prefix += user.become()
        return prefix + [str(part) for part in command]

    def env(self, user: User | None) -> dict[str, str]:
        """This process's environment, with a HOME the user can use and no token."""
        env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
        if user is not None:
            env["HOME"] = "/tmp"
        return env

    def popen(self, command: Sequence[str], user: User | None = None, **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("env", self.env(user))
        return subprocess.Popen(self.argv(command, user), cwd=REPO, **kwargs)

    def run(self, command: Sequence[str], user: User | None = None, timeout: float = 60,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("env", self.env(user))
        return subprocess.run(self.argv(command, user), cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, **kwargs)
