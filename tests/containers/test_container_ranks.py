"""Ranks in containers, watched by a root agent on the host (issue 28): containers made with
unshare (testkit/containers.py: own pid, mount, network, IPC and UTS namespaces, a private tmpfs
/dev/shm, a Docker-named cgroup; one rootless, its root an unprivileged host uid).

- A 4-rank gloo job under `tuiprof run` inside a container: its ranks are listed with their host
  pids and their pids in the container, `tuiprof stacks` merges them from the host, and the rank
  that stops joining collectives is named.
- A rank in a rootless container is its host user's, and a timeline dump by host pid reads it; one that crashes leaves its report; the
  console (tmux) lists a containerised rank with its container and its pid there.
- Hostile containers: segments that name a host process, another container's process, or a pid
  that means another process on the host, get nothing and are counted by reason; a container
  whose /dev/shm is a link gets nothing followed.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from agentd.collectors import rank_claims
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import running_agent
from testkit.containers import Container
from testkit.namespaces import HOSTILE_USER, User, unavailable_reason, wait_ready
from testkit.ports import free_port
from testkit.terminal import tmux_environment
from tuiprof.client.channel import open_channel
from tuiprof.commands.run import launch_environment

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the container jobs need the PyTorch CPU build")

GLOO_JOB = pathlib.Path(__file__).parents[1] / "hangs" / "gloo_job.py"
STUCK_RANK = 2
HANG_TIMEOUT_S = 4
SEGMENT_PREFIX = "tuiprof-"

# One rank that steps every 0.1 s under `tuiprof run`'s environment (the hook library preloaded).
STEPPING_RANK = """
import ctypes, os, time
import torch  # noqa: F401
lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
lib.tuiprof_record_step()
print("ready", flush=True)
while True:
    time.sleep(0.1)
    lib.tuiprof_record_step()
"""


@pytest.fixture(scope="module", autouse=True)
def containers_possible() -> None:
    reason = unavailable_reason(user_name=None)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with running_agent(tmp_path_factory.mktemp("container-agent"), interval_ms=250,
                       extra_args=["--hang-timeout-s", str(HANG_TIMEOUT_S), "--hang-suspect-s", "2"]) as agent:
        yield agent


async def snapshots(agent, until, timeout: float = 120) -> pb.HostSnapshot:
    """The first snapshot for which ``until(snapshot)`` holds."""
    last = None
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest())
        try:
            async with asyncio.timeout(timeout):
                async for snapshot in call:
                    last = snapshot
                    if until(snapshot):
                        return snapshot
        except TimeoutError:
            ranks = [(r.pid, r.pid_in_container, r.job_id, r.state) for r in last.ranks] if last else None
            raise AssertionError(f"not within {timeout} s; last ranks {ranks}, refused "
                                 f"{[(e.reason, e.files) for e in last.rank_segments_refused if e.files] if last else None}"
                                 ) from None
        finally:
            call.cancel()
    raise AssertionError("the stream ended")


def start_stepping_rank(box: Container) -> subprocess.Popen[str]:
    """A rank inside ``box``; returns once it stepped (its segment exists)."""
    env = launch_environment({k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}, kineto_daemon=False)
    return wait_ready(box.popen([sys.executable, "-c", STEPPING_RANK], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True))


def only_child(box: Container, launcher: subprocess.Popen) -> tuple[int, int]:
    """(host pid, pid inside) of the process an nsenter launched (``-p`` forks it)."""
    inside = box.host_pids()
    child = int(pathlib.Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()[0])
    return child, inside[child]


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(10)


def test_a_gloo_job_in_a_container_is_listed_merged_and_its_stuck_rank_named(agent, tmp_path):
    job_id = f"boxjob-{uuid.uuid4().hex[:8]}"
    with Container.create() as box, open(tmp_path / "job.log", "wb") as log:
        env = {**{k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}, "OMP_NUM_THREADS": "1"}
        job = box.popen([sys.executable, "-m", "tuiprof.cli", "run", "--",
                         sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
                         "--master-addr", "127.0.0.1", "--master-port", str(free_port("127.0.0.1")),
                         "--rdzv-id", job_id, str(GLOO_JOB), "--stuck-rank", str(STUCK_RANK)],
                        env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            def hung(snapshot: pb.HostSnapshot) -> bool:
                pids = {r.pid for r in snapshot.ranks if r.job_id == job_id and r.state != pb.RANK_STATE_EXITED}
                return len(pids) == 4 and len([v for v in snapshot.hang.ranks if v.pid in pids and v.level == pb.HANG_LEVEL_HUNG]) == 4

            snapshot = asyncio.run(snapshots(agent, hung, timeout=180))
            inside = box.host_pids()
            ranks = [r for r in snapshot.ranks if r.job_id == job_id]
            assert sorted(r.rank for r in ranks) == [0, 1, 2, 3]
            for rank in ranks:  # the host pid, and the pid the rank sees itself
                assert rank.pid in inside and rank.pid_in_container == inside[rank.pid], (rank.pid, inside)
                assert rank.uid == 0
                if box.cgroup is not None:  # named as Docker names a container's cgroup
                    assert (rank.container.runtime, rank.container.id) == ("docker", box.id), rank.container

            done = subprocess.run([sys.executable, "-m", "tuiprof.cli", "stacks", "--json", "--job", job_id,
                                   agent.address.target], capture_output=True, text=True, timeout=120)
            assert done.returncode == 3, done.stderr  # 3: the job is hung
            doc = json.loads(done.stdout)
            errors = [p["error"] for h in doc["hosts"] for p in h["processes"] if p["error"]]
            assert not errors, errors
            assert doc["ranks"] == 4
            assert [s["ranks"] for s in doc["suspects"]] == [str(STUCK_RANK)]
            assert "stop_joining_and_sleep (gloo_job.py)" in doc["suspects"][0]["reason"], doc["suspects"]
        finally:
            stop(job)
            log.flush()


def test_a_rank_in_a_rootless_container_is_its_host_users(agent, tmp_path):
    user = User.lookup(HOSTILE_USER)
    with Container.create(rootless_as=user) as box:
        launcher = start_stepping_rank(box)
        try:
            host_pid, inner_pid = only_child(box, launcher)
            snapshot = asyncio.run(snapshots(agent, lambda s: any(r.pid == host_pid for r in s.ranks)))
            rank = next(r for r in snapshot.ranks if r.pid == host_pid)
            # The segment is named tuiprof-0-<inner pid>-…: uid 0 is the container's root, the host's `user`.
            names = [n for n in os.listdir(f"/proc/{host_pid}/root/dev/shm") if n.startswith(SEGMENT_PREFIX)]
            assert any(n.startswith(f"{SEGMENT_PREFIX}0-{inner_pid}-") for n in names), names
            assert (rank.uid, rank.pid_in_container, rank.state) == (user.uid, inner_pid, pb.RANK_STATE_RUNNING)
            if box.cgroup is not None:
                assert (rank.container.id, rank.container.own_mount_namespace) == (box.id, True), rank.container

            # A timeline dump by host pid, read from the segment in the container's /dev/shm.
            done = subprocess.run([sys.executable, "-m", "tuiprof.cli", "trace", agent.address.target, "--kind",
                                   "timeline", "--last-events", "100", "--pids", str(host_pid), "--output",
                                   str(tmp_path), "--fetch", "all", "--json"], capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr + done.stdout
            [target] = json.loads(done.stdout)["hosts"][0]["targets"]
            assert (target["pid"], target["state"]) == (host_pid, "written"), target
            assert target["file"].startswith(f"timeline/{user.uid}/"), target  # the rank's host uid
            events = json.loads(pathlib.Path(target["local"]).read_text())["traceEvents"]
            assert any(e.get("name", "").startswith("ProfilerStep#") for e in events), events[:5]
            assert rank.step_count > 0
        finally:
            stop(launcher)


def refusals(snapshot: pb.HostSnapshot) -> dict[str, int]:
    return {entry.reason: entry.files for entry in snapshot.rank_segments_refused if entry.files}


def forge(box: Container, name: str) -> None:
    """A file in the container's /dev/shm, written by the container's root (the hostile user on the host)."""
    done = box.run(["sh", "-c", f"head -c 4096 /dev/zero > /dev/shm/{name}"])
    assert done.returncode == 0, done.stderr


def test_hostile_containers_cannot_claim_processes_outside_themselves(agent):
    user = User.lookup(HOSTILE_USER)
    with Container.create(rootless_as=user) as box, Container.create(rootless_as=user) as other:
        victim = start_stepping_rank(other)  # a real rank of the same host user, in a second container
        try:
            victim_host, victim_inner = only_child(other, victim)
            asyncio.run(snapshots(agent, lambda s: any(r.pid == victim_host for r in s.ranks)))
            host_process = subprocess.Popen(  # the same user's process on the host
                [*user.become(), "sleep", "300"])
            try:
                forged = {
                    f"{SEGMENT_PREFIX}0-{host_process.pid}-00000000000000a1": "a host process",
                    f"{SEGMENT_PREFIX}0-{victim_host}-00000000000000a2": "another container's, by host pid",
                }
                for name in forged:
                    forge(box, name)

                def counted(snapshot: pb.HostSnapshot) -> bool:
                    return refusals(snapshot).get(rank_claims.PID_NAMESPACE, 0) >= len(forged)

                snapshot = asyncio.run(snapshots(agent, counted, timeout=30))
                listed = {r.pid for r in snapshot.ranks}
                assert host_process.pid not in listed
                assert victim_host in listed  # the real one, from its own container, once
                assert [r.pid_in_container for r in snapshot.ranks if r.pid == victim_host] == [victim_inner]
            finally:
                stop(host_process)
        finally:
            stop(victim)


def test_a_container_pid_in_a_shared_dev_shm_is_not_taken_for_the_host_process(agent):
    """A container that shares the host's /dev/shm (--ipc=host) but has its own pid namespace: a name with
    the pid of one of its processes, a small number that is also a host process's (a kernel thread), means
    two processes; neither has the file mapped: refused, and neither is listed."""
    user = User.lookup(HOSTILE_USER)
    with Container.create(rootless_as=user, shared_shm=True) as box:
        sleeper = box.popen(["sleep", "300"])
        try:
            time.sleep(0.3)
            _, inner = only_child(box, sleeper)
            if not os.path.exists(f"/proc/{inner}/ns/mnt"):
                pytest.skip(f"no host process has pid {inner} here: nothing for the container's pid to be mistaken for")
            name = f"{SEGMENT_PREFIX}0-{inner}-00000000000000b1"
            forge(box, name)
            snapshot = asyncio.run(snapshots(
                agent, lambda s: refusals(s).get(rank_claims.AMBIGUOUS_PID, 0) >= 1, timeout=30))
            assert inner not in {r.pid for r in snapshot.ranks}
        finally:
            stop(sleeper)
            pathlib.Path("/dev/shm", f"{SEGMENT_PREFIX}0-{inner}-00000000000000b1").unlink(missing_ok=True)


def test_a_container_whose_dev_shm_is_a_link_gets_nothing_followed(agent):
    """The container's /dev/shm is a link to a host folder: the agent must not read that folder through the
    container. A file there under a rank file's name would be judged, and its refusal logged by name."""
    user = User.lookup(HOSTILE_USER)
    decoy = pathlib.Path("/tmp") / f"tpdecoy-{uuid.uuid4().hex[:8]}"
    decoy.mkdir(mode=0o755)
    try:
        with Container.create(rootless_as=user, shm_link_to=str(decoy)) as box:
            planted = f"{SEGMENT_PREFIX}0-{box.init_pid}-{uuid.uuid4().hex[:16]}"
            os.mkfifo(decoy / planted)  # not a regular file: refused (and logged) if ever looked at
            time.sleep(6)  # past the agent's namespace scan period
            assert os.path.islink(f"/proc/{box.init_pid}/root/dev/shm")
            assert planted not in agent.log()
            assert planted[len(SEGMENT_PREFIX):] not in agent.log()
    finally:
        for path in decoy.iterdir():
            path.unlink()
        decoy.rmdir()


CRASHING_RANK = """
import ctypes, os, sys, time
import torch  # noqa: F401
lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
for _ in range(5):
    lib.tuiprof_record_step()
    time.sleep(0.1)
print("ready", flush=True)
sys.stdin.readline()
raise RuntimeError("CUDA out of memory (a container's rank, on purpose)")
"""


def test_a_containerised_rank_that_crashes_leaves_its_report(agent):
    """The startup hook's exception file lies beside the segment in the container's /dev/shm: the agent
    reads it there, through the folder it opened."""
    with Container.create() as box:
        env = launch_environment({k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}, kineto_daemon=False)
        rank = box.popen([sys.executable, "-c", CRASHING_RANK], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert rank.stdin is not None
        wait_ready(rank)
        host_pid, inner_pid = only_child(box, rank)
        asyncio.run(snapshots(agent, lambda s: any(r.pid == host_pid for r in s.ranks)))
        rank.stdin.write("\n")
        rank.stdin.flush()
        rank.wait(30)
        snapshot = asyncio.run(snapshots(
            agent, lambda s: any(r.pid == host_pid and r.state == pb.RANK_STATE_EXITED for r in s.ranks), timeout=30))
        report = next(r for r in snapshot.ranks if r.pid == host_pid)
        assert "RuntimeError: CUDA out of memory (a container's rank, on purpose)" in report.exception
        assert report.pid_in_container == inner_pid and report.exit_code == 1, report


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_console_shows_a_containerised_rank_with_where_it_runs(agent):
    """`tuiprof connect` in tmux: the host view's Ranks tab lists the rank with its container and its pid there."""
    with Container.create() as box:
        launcher = start_stepping_rank(box)
        socket = f"tpbox{os.getpid()}"
        try:
            host_pid, inner_pid = only_child(box, launcher)
            asyncio.run(snapshots(agent, lambda s: any(r.pid == host_pid for r in s.ranks)))
            tmux = ["tmux", "-L", socket]
            subprocess.run([*tmux, "new-session", "-d", "-s", "console", "-x", "240", "-y", "50",
                            sys.executable, "-m", "tuiprof.cli", "connect", agent.address.target],
                           check=True, env=tmux_environment(), timeout=10)

            def screen() -> str:
                return subprocess.run([*tmux, "capture-pane", "-p", "-t", "console"], capture_output=True,
                                      text=True, timeout=10, env=tmux_environment()).stdout

            def wait(condition, what: str, keys: tuple[str, ...] = ()) -> str:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if keys:
                        subprocess.run([*tmux, "send-keys", "-t", "console", *keys], timeout=10,
                                       env=tmux_environment())
                    time.sleep(0.5)
                    if condition(seen := screen()):
                        return seen
                raise AssertionError(f"no {what} on screen:\n{seen}")

            # one host: the console opens its host view by itself
            shown = wait(lambda s: str(host_pid) in s and f"docker {box.id[:12]}" in s, "ranks tab row", ("4",))
            row = next(line for line in shown.splitlines() if str(host_pid) in line and box.id[:12] in line)
            assert f"pid {inner_pid}" in row, row
        finally:
            subprocess.run(["tmux", "-L", socket, "kill-server"], timeout=10, env=tmux_environment())
            stop(launcher)
