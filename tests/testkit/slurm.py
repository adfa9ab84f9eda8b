"""A real SLURM cluster on this machine: munged, slurmctld and one slurmd per node.

Several slurmd processes stand for several nodes: each runs with ``-N NODE``,
listens on its own port (``Port=`` per node in slurm.conf) and keeps its own
spool directory (``%n`` in the paths). Node names map to their own loopback
addresses through /etc/hosts, so anything that connects to a node by name
(the console, gRPC) reaches what listens on that address.

Needs root (slurmd runs jobs as their user, /etc/hosts is edited) and the
Debian packages munge and slurm-wlm (tests/run.sh installs them).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil

from testkit.ports import free_port

log = logging.getLogger(__name__)

HOSTS_FILE = pathlib.Path("/etc/hosts")
HOSTS_TAG = "# tuiprof-testkit-slurm"
HOSTS_LOCK = pathlib.Path(tempfile.gettempdir()) / "tuiprof-testkit-hosts.lock"
STARTUP_TIMEOUT_S = 30.0
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENT_TOOLS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")


class SlurmClusterError(RuntimeError):
    """The test cluster could not be started; the message carries the daemons' last log lines."""


def unavailable_reason() -> str | None:
    """Why a test SLURM cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the SLURM test cluster needs root (slurmd, /etc/hosts)"
    missing = [name for name in _DAEMONS + _CLIENT_TOOLS if shutil.which(name, path=_SEARCH_PATH) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing): apt-get install munge slurm-wlm"
    return None


@dataclass
class SlurmCluster:
    """A running test cluster; its client tools find it through ``env['SLURM_CONF']``."""

    root: pathlib.Path
    conf: pathlib.Path
    nodes: dict[str, str]
    """Node name -> the loopback address /etc/hosts maps it to."""
    env: dict[str, str]
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def tool(self, *argv: str, timeout_s: float = 30.0) -> str:
        """Run a SLURM client tool against this cluster; its stdout."""
        result = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, check=False,
        )
        if result.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def submit(self, *sbatch_args: str) -> str:
        """Submit a batch job (output goes to the cluster's directory); its job id."""
        out = self.tool(
            "sbatch", "--parsable", f"--chdir={self.root}", f"--output={self.root}/job-%j.out", *sbatch_args
        )
        return out.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        return self.tool("squeue", "-j", job_id, "-t", "all", "-h", "-o", "%T").strip()

    def wait_for_state(self, job_id: str, states: set[str], timeout_s: float = 30.0) -> str:
        """Poll until the job is in one of ``states``; the state reached."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.2)
        raise SlurmClusterError(f"job {job_id} is {state or 'not listed'} after {timeout_s:g} s, not {sorted(states)}")

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for error messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


@contextlib.contextmanager
def slurm_cluster(node_count: int = 3) -> Iterator[SlurmCluster]:
    """Start a cluster of ``node_count`` nodes named tpnode1..N; stop it and undo every change on exit.

    Sets ``SLURM_CONF`` in this process's environment while it runs (so code under
    test finds the cluster as it would on a login node) and restores it after.
    """
    # A short directory: slurmd's unix sockets live under it (108-byte path limit).
    root = pathlib.Path(tempfile.mkdtemp(prefix="tpslurm-"))
    nodes = {f"tpnode{i}": f"127.0.77.{i}" for i in range(1, node_count + 1)}
    conf = root / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": _SEARCH_PATH}
    cluster = SlurmCluster(root, conf, nodes, env)
    saved_conf = os.environ.get("SLURM_CONF")
    try:
        _start(cluster)
        _add_hosts_entries(cluster)
        os.environ["SLURM_CONF"] = str(conf)
        yield cluster
    finally:
        if saved_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved_conf
        _remove_hosts_entries(root)
        _stop(cluster)
        shutil.rmtree(root, ignore_errors=True)


def _start(cluster: SlurmCluster) -> None:
    root = cluster.root
    for sub in ("state", "spool", "log", "munge"):
        (root / sub).mkdir()
    # munged checks that its socket directory is searchable by everyone and its key private.
    os.chmod(root, 0o755)
    (root / "munge").chmod(0o755)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket = root / "munge" / "munge.socket"
    _spawn(cluster, "munged", [
        "munged", "--foreground", f"--key-file={key}", f"--socket={socket}",
        f"--pid-file={root}/munged.pid", f"--log-file={root}/log/munged.log", f"--seed-file={root}/munged.seed",
    ])
    _wait(cluster, socket.exists, "munged to create its socket")
    cluster.conf.write_text(_slurm_conf(root, socket, cluster.nodes))
    _spawn(cluster, "slurmctld", ["slurmctld", "-D", "-f", str(cluster.conf)])
    for node in cluster.nodes:
        _spawn(cluster, f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(cluster.conf)])

    def all_idle() -> bool:
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=cluster.env, capture_output=True, text=True,
            timeout=10, check=False,
        )
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return result.returncode == 0 and all(states.get(node) == "idle" for node in cluster.nodes)

    _wait(cluster, all_idle, f"nodes {', '.join(cluster.nodes)} to be idle")


def _slurm_conf(root: pathlib.Path, munge_socket: pathlib.Path, nodes: dict[str, str]) -> str:
    node_lines = [
        f"NodeName={name} NodeAddr={address} Port={free_port()} CPUs=1 RealMemory=100 State=UNKNOWN"
        for name, address in nodes.items()
    ]
    return "\n".join([
        "ClusterName=tuiproftest",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        # No cgroups, no accounting: the parts a container cannot give and the tests do not need.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/linear",
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=2",
        *node_lines,
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _spawn(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    path = shutil.which(argv[0], path=_SEARCH_PATH)
    if path is None:
        raise SlurmClusterError(f"{argv[0]} is not installed: apt-get install munge slurm-wlm")
    with open(cluster.root / "log" / f"{name}.out", "wb") as out:
        cluster.daemons[name] = subprocess.Popen(
            [path, *argv[1:]], env=cluster.env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )


def _wait(cluster: SlurmCluster, ready, what: str) -> None:
    """Poll ``ready`` until it holds; fail early with the logs if a daemon died."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [f"{name} (exit {proc.returncode})" for name, proc in cluster.daemons.items() if proc.poll() is not None]
        if dead:
            raise SlurmClusterError(f"{', '.join(dead)} stopped while waiting for {what}\n{cluster.logs()}")
        if ready():
            return
        time.sleep(0.2)
    raise SlurmClusterError(f"timed out after {STARTUP_TIMEOUT_S:g} s waiting for {what}\n{cluster.logs()}")


def _stop(cluster: SlurmCluster) -> None:
    """Kill the jobs' processes, then the daemons; nothing of the cluster outlives the test.

    Daemons stop in reverse start order: slurmd and slurmctld need munged (and
    slurmd its controller) while they shut down, and stall for seconds without them.
    """
    for step_daemon in _job_step_daemons(cluster.root):
        _kill_session(step_daemon)
    for name, proc in reversed(cluster.daemons.items()):
        if proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("daemon ignored SIGTERM, killing it", extra={"daemon": name, "pid": proc.pid})
            proc.kill()
            proc.wait(timeout=10)


def _job_step_daemons(root: pathlib.Path) -> list[int]:
    """The slurmstepd processes of this cluster (each daemonizes into its own session).

    They are recognised by the slurmd log file under ``root`` they keep open.
    """
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "slurmstepd":
            continue
        with contextlib.suppress(OSError):
            fds = pathlib.Path(f"/proc/{proc.pid}/fd").iterdir()
            if any(os.readlink(fd).startswith(f"{root}/") for fd in fds):
                found.append(proc.pid)
    return found


def _kill_session(step_daemon: int) -> None:
    """SIGKILL a slurmstepd and every process of its session (the job's processes)."""
    with contextlib.suppress(ProcessLookupError):
        session = os.getsid(step_daemon)
        if session in (0, 1, os.getsid(0)):
            raise SlurmClusterError(f"slurmstepd {step_daemon} shares session {session}; not killing it")
        for proc in psutil.process_iter():
            with contextlib.suppress(ProcessLookupError):
                if os.getsid(proc.pid) == session:
                    os.kill(proc.pid, signal.SIGKILL)


def _add_hosts_entries(cluster: SlurmCluster) -> None:
    """Map the node names to their addresses, first dropping entries left by dead test runs."""
    tag = f"{HOSTS_TAG} {os.getpid()} {cluster.root}"
    with _hosts_file_lock():
        lines = [line for line in HOSTS_FILE.read_text().splitlines() if not _is_stale_entry(line)]
        lines += [f"{address} {name} {tag}" for name, address in cluster.nodes.items()]
        # Rewritten in place: /etc/hosts is often a bind mount that cannot be replaced by rename.
        HOSTS_FILE.write_text("\n".join(lines) + "\n")


def _remove_hosts_entries(root: pathlib.Path) -> None:
    with _hosts_file_lock():
        lines = HOSTS_FILE.read_text().splitlines()
        kept = [line for line in lines if not (HOSTS_TAG in line and line.endswith(f" {root}"))]
        if len(kept) != len(lines):
            HOSTS_FILE.write_text("\n".join(kept) + "\n")


@contextlib.contextmanager
def _hosts_file_lock() -> Iterator[None]:
    """Serialises the edits of test runs that share this machine (each rewrites the whole file)."""
    with open(HOSTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_stale_entry(line: str) -> bool:
    if HOSTS_TAG not in line:
        return False
    fields = line.split(HOSTS_TAG, 1)[1].split()
    return not fields or not fields[0].isdigit() or not psutil.pid_exists(int(fields[0]))
