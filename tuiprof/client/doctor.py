"""What works on this host for tuiprof and what does not, each with why and the one line that fixes it.

The collectors' own verdicts come from an embedded agent's first snapshots (the
same code that serves the console: NVML, GPM, PMU scope, the ranks' shared
memory); the rest is asked of the kernel directly: who listens on the agent's
ports, whether Kineto's host-wide socket is served, py-spy and the ptrace scope,
room in /dev/shm, and processes in other PID namespaces.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import stat
from dataclasses import dataclass

from agentd import peer
from agentd.address import DEFAULT_AGENT_PORT, DEFAULT_METRICS_PORT
from agentd.hang.pyspy import PySpyMissing, find_pyspy
from agentd.kineto.endpoint import ABSTRACT_NAME
from agentd.kineto.holder import holders, socket_inodes
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import user_label
from agentd.token import TokenFileError, read_token
from tuiprof.client.local import embedded_agent

DOCTOR_INTERVAL_MS = 500
SNAPSHOT_WAIT_S = 10.0
PTRACE_SCOPE = pathlib.Path("/proc/sys/kernel/yama/ptrace_scope")
PERF_EVENT_PARANOID = pathlib.Path("/proc/sys/kernel/perf_event_paranoid")
KINETO_SOCKET = "@dynolog@"  # how /proc/net/unix shows libkineto's abstract \0dynolog\0
SHM = pathlib.Path("/dev/shm")
NODE_TOKEN_FILE = pathlib.Path("/etc/tuiprof/token")  # where agentd's systemd unit keeps it


@dataclass(frozen=True)
class Check:
    """One thing tuiprof relies on: whether it works here, what was found, and how to fix it."""

    area: str
    ok: bool
    finding: str
    fix: str = ""


async def host_checks(agent_ports: tuple[int, int] = (DEFAULT_AGENT_PORT, DEFAULT_METRICS_PORT),
                      token_file: pathlib.Path = NODE_TOKEN_FILE) -> list[Check]:
    """Every check, in the order a person reads them: GPUs, CPU counters, the agent (on ``agent_ports``:
    gRPC, /metrics, and its ``token_file``), traces, stacks, ranks."""
    info, snapshot = await _first_snapshot()
    checks = _collector_checks(info, snapshot)
    checks += [_agent_ports(agent_ports), _token(token_file), _kineto_socket(), _pyspy(), _shared_memory(),
               _namespaces()]
    return checks


def _token(path: pathlib.Path) -> Check:
    """Whether the token file can be used, by the same rules agentd and every command apply."""
    if not path.exists():
        return Check("token", True, f"no {path}: the agent serves local users by the uid the kernel names; "
                     "remote consoles need a token (README, agentd)")
    try:
        read_token(path)
    except TokenFileError as exc:
        return Check("token", False, str(exc))
    mode = stat.filemode(path.stat().st_mode)
    return Check("token", True, f"{path}: usable ({mode}, owned by {user_label(path.stat().st_uid)})")


async def _first_snapshot() -> tuple[pb.AgentInfo, pb.HostSnapshot]:
    """The embedded agent's info and its second snapshot (the first with rates)."""
    async with embedded_agent(DOCTOR_INTERVAL_MS) as agent:
        info = await agent.info()
        deadline = asyncio.get_running_loop().time() + SNAPSHOT_WAIT_S
        while True:
            latest = agent.latest()
            if (latest is not None and latest.snapshot.sequence >= 2) or \
                    asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(DOCTOR_INTERVAL_MS / 4000)
        return info, latest.snapshot if latest is not None else pb.HostSnapshot()


def _collector_checks(info: pb.AgentInfo, snapshot: pb.HostSnapshot) -> list[Check]:
    statuses = {status.name: status for status in snapshot.collectors or info.collectors}
    gpus = [_gpu(statuses.get("gpu"), info, snapshot)] + ([_gpm(snapshot)] if snapshot.gpus else [])
    return gpus + [_pmu(statuses.get("pmu"), snapshot)]


def _gpu(status: pb.CollectorStatus | None, info: pb.AgentInfo, snapshot: pb.HostSnapshot) -> Check:
    if status is None or not status.available:
        reason = status.reason if status is not None else "the GPU collector did not report"
        return Check("NVML", False, f"GPU metrics unavailable: {reason}",
                     "install the NVIDIA driver (nvidia-smi must work) and nvidia-ml-py in tuiprof's environment")
    names = sorted({gpu.name for gpu in snapshot.gpus})
    return Check("NVML", True, f"driver {info.driver_version}, {len(snapshot.gpus)} GPU(s) ({', '.join(names)})")


def _gpm(snapshot: pb.HostSnapshot) -> Check:
    missing = {gpu.index: gpu.unavailable["sm_active_percent"] for gpu in snapshot.gpus
               if "sm_active_percent" in gpu.unavailable}
    if not missing:
        return Check("GPM", True, f"SM activity, occupancy and pipe activity on all {len(snapshot.gpus)} GPU(s)")
    index, reason = next(iter(sorted(missing.items())))
    return Check("GPM", False, f"no SM activity on {len(missing)} GPU(s), e.g. GPU {index}: {reason}",
                 "GPM needs Hopper or newer; where `dyno dcgm-pause` paused it, it resumes by itself")


def _pmu(status: pb.CollectorStatus | None, snapshot: pb.HostSnapshot) -> Check:
    paranoid = _read_int(PERF_EVENT_PARANOID)
    level = f"perf_event_paranoid {paranoid}" if paranoid is not None else "perf_event_paranoid unreadable"
    if status is None or not status.available:
        reason = status.reason if status is not None else "the PMU collector did not report"
        return Check("PMU", False, f"CPU counters unavailable ({level}): {reason}",
                     "run agentd as root, or `sysctl kernel.perf_event_paranoid=0` for host-wide counters")
    pmu = snapshot.pmu
    scope = "host-wide (every CPU)" if pmu.scope == "system" else "per process (the ranks only)"
    hardware = "hardware and software events" if pmu.hardware_available else \
        f"software events only; hardware: {pmu.hardware_reason}"
    fix = "" if pmu.scope == "system" else \
        "host-wide counters need root, CAP_PERFMON or `sysctl kernel.perf_event_paranoid=0`"
    return Check("PMU", pmu.scope == "system", f"{scope}, {hardware} ({level})", fix)


def _agent_ports(ports: tuple[int, int]) -> Check:
    """Who listens on the node agent's gRPC and /metrics ports, on both loopback addresses."""
    found: list[str] = []
    strangers: list[str] = []
    for port in ports:
        for host in ("127.0.0.1", "::1"):
            try:
                uid = peer.tcp_socket_uid((host, port), None)
            except peer.PeerLookupError as exc:
                return Check("agentd", False, f"cannot tell who listens on port {port}: {exc}")
            if uid is None:
                continue
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            (found if uid == 0 or uid == os.getuid() else strangers).append(f"{where} ({user_label(uid)})")
    if strangers:
        return Check("agentd", False, f"the agent's ports are held by another user: {', '.join(strangers)}",
                     "that process is not the node's agent: stop it (`ss -ltnp`), then `systemctl restart agentd`")
    if not found:
        return Check("agentd", False, f"no agent listens on ports {ports[0]}/{ports[1]}: the "
                     "console watches this host through its own embedded agent",
                     "for traces of every user's jobs and /metrics, run agentd as root "
                     "(agentd/systemd/agentd.service)")
    return Check("agentd", True, f"listening: {', '.join(found)}")


def _kineto_socket() -> Check:
    """Whether libkineto's host-wide abstract socket is served in this network namespace, and by whom."""
    try:
        bound = socket_inodes(ABSTRACT_NAME)
        found = holders(ABSTRACT_NAME) if bound else []
    except OSError as exc:
        return Check("Kineto", False, f"cannot read /proc/net/unix: {exc.strerror}")
    if not bound:
        return Check("Kineto", False, f"nothing serves {KINETO_SOCKET}: on-demand traces of PyTorch jobs "
                     "(tuiprof trace, dyno gputrace) have no daemon to poll", "run agentd as root on this host")
    strangers = [holder for holder in found if holder.uid not in (0, None)]
    if strangers:
        return Check("Kineto", False, f"{KINETO_SOCKET} is held by {', '.join(map(str, strangers))}: jobs that poll "
                     "it talk to that process, not to the node's agent",
                     "stop that process; agentd takes the name within 5 s (jobs under `tuiprof run` use "
                     "their own folder and are not affected)")
    who = ", ".join(map(str, found)) if found else "a process you cannot inspect (root's agent, as a user)"
    return Check("Kineto", True, f"{KINETO_SOCKET} is served by {who}: PyTorch jobs can be traced on demand")


def _pyspy() -> Check:
    try:
        binary = find_pyspy()
    except PySpyMissing as exc:
        return Check("py-spy", False, f"no Python stacks for hangs or `tuiprof stacks`: {exc}")
    scope = _read_int(PTRACE_SCOPE)
    if os.geteuid() != 0 and scope is not None and scope >= 1:
        return Check("py-spy", False, f"{binary}; ptrace_scope {scope}: as a user it can dump only its own children, "
                     "not your running jobs", "let the node's root agentd take stacks, or "
                     "`sysctl kernel.yama.ptrace_scope=0`")
    shown = "no Yama LSM" if scope is None else f"ptrace_scope {scope}"
    return Check("py-spy", True, f"{binary} ({shown})")


def _shared_memory() -> Check:
    """Room in /dev/shm for the ranks' telemetry segments."""
    from tuiprof_native.segment import SEGMENT_SIZE

    try:
        space = os.statvfs(SHM)
    except OSError as exc:
        return Check("/dev/shm", False, f"cannot read {SHM}: {exc.strerror}",
                     "ranks under `tuiprof run` need a writable /dev/shm")
    free = space.f_bavail * space.f_frsize
    ranks = free // SEGMENT_SIZE
    finding = f"{free / 2**20:.0f} MiB free: room for {ranks} rank segment(s) of {SEGMENT_SIZE / 2**20:.1f} MiB"
    if ranks < 8:
        return Check("/dev/shm", False, finding, "make /dev/shm larger (containers: --shm-size) or free it")
    return Check("/dev/shm", True, finding)


def _namespaces() -> Check:
    """Processes in other PID namespaces (containers): their ranks are not watched by this host's agent."""
    try:
        own = os.readlink("/proc/self/ns/pid")
    except OSError as exc:
        return Check("containers", False, f"cannot read this process's PID namespace: {exc.strerror}")
    others: dict[str, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            namespace = os.readlink(f"/proc/{entry.name}/ns/pid")
        except OSError:
            continue  # gone, or another user's process we may not inspect
        if namespace != own:
            others[namespace] = others.get(namespace, 0) + 1
    seen = "" if os.geteuid() == 0 else " (of your own processes: others' cannot be inspected as a user)"
    if not others:
        return Check("containers", True, f"no process in another PID namespace{seen}")
    return Check("containers", False, f"{sum(others.values())} process(es) in {len(others)} other PID "
                 f"namespace(s){seen}: ranks in containers are not seen by this host's agent yet",
                 "run the job on the host, or `tuiprof` inside the container")


def _read_int(path: pathlib.Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
