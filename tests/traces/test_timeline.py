"""Timeline captures: the agent dumps a rank's hook event ring straight from shared memory.

The rank is the stand-in GPU workload of the native tests (tests/native/standins) under
`tuiprof run`, so every GEMM and collective, and its stand-in kernel time, is known:
a GEMM takes 10 us + 2*b*m*n*k/100 ns, each collective what the stand-in NCCL reports.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from itertools import pairwise

import pytest

from agentd import procfs
from native.conftest import standins  # noqa: F401  (the stand-in GPU libraries, built with gcc)
from native.segment_forge import forged, plant
from native.support import segment_path, stand_in_rank, wait_for
from testkit.traces import as_user, hostile_user, run_cli
from tuiprof_native import segment

pytestmark = pytest.mark.slow

GEMMS = {  # (op, dtype) -> (count, kernel µs); each shape's first call is apart ("first call (includes loading)")
    ("cublasGemmEx", "bf16"): (4, 10.655),
    ("cublasGemmStridedBatchedEx", "fp16"): (2, 10.040),
    ("cublasSgemm_v2", "fp32"): (1, 10.081),
    ("cublasLtMatmul", "bf16"): (3, 10.081),
    ("cublasLtMatmul", "fp32"): (1, 10.020),
}
COLLECTIVES = {"AllReduce": (3, 50.0), "AllGather": (2, 20.0), "ReduceScatter": (1, 30.0), "Send": (2, 5.0)}


@pytest.fixture
def workload(standins):  # noqa: F811
    """The stand-in job as rank 3, stopped at READY with its segment live."""
    with stand_in_rank(standins, {"RANK": "3", "WORLD_SIZE": "4"}) as process:
        yield process


def test_last_events_dump_has_every_gemm_and_collective_with_its_kernel_time(agent, workload, tmp_path):
    result = run_cli("trace", agent.address.target, "--kind", "timeline", "--last-events", "1000",
                     "--pids", str(workload.pid), "--output", str(tmp_path), "--fetch", "all", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    [target] = doc["hosts"][0]["targets"]
    assert target["pid"] == workload.pid and target["rank"] == 3 and target["state"] == "written"
    # Written by the agent into its own folder for the rank's user: timeline/<uid>/, 0700, the file 0600.
    uid = os.getuid()
    assert target["file"].startswith(f"timeline/{uid}/")
    for path, mode in [(agent.trace_dir / "timeline" / str(uid), 0o700), (agent.trace_dir / target["file"], 0o600)]:
        info = path.lstat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), mode), path
    assert not list((agent.trace_dir / "timeline" / str(uid)).glob("*.tmp"))
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    assert trace["distributedInfo"]["rank"] == 3
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    gemms = collections.defaultdict(list)
    collectives = collections.defaultdict(list)
    for event in kernels:
        if event["name"].startswith("nccl:"):
            collectives[event["args"]["Collective name"]].append(event["dur"])
        else:
            gemms[(event["name"], event["args"]["dtype"])].append(event["dur"])
    assert {key: (len(durs), round(durs[0], 3)) for key, durs in gemms.items()} == GEMMS
    assert all(len(set(durs)) == 1 for durs in gemms.values())
    assert {op: (len(durs), durs[0]) for op, durs in collectives.items()} == COLLECTIVES
    first_calls = [e for e in trace["traceEvents"] if e.get("cat") == "first_call"]
    assert sorted((e["name"], e["args"]["dtype"]) for e in first_calls) == sorted(
        (f"{op} (first call (includes loading))", dtype) for op, dtype in GEMMS)
    lanes = collections.defaultdict(list)  # GEMMs on one stream run one after another: no overlap in a lane
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "first_call") and event["tid"] != 1:
            lanes[event["tid"]].append((event["ts"], event["ts"] + event["dur"]))
    assert len(lanes) == 1  # the stalled stream's GEMM never finished
    for lane in lanes.values():
        assert all(after[0] >= before[1] - 0.001 for before, after in pairwise(sorted(lane)))
    assert trace["tuiprof"]["gemm_timing"] == {"timed_first": 32, "sample_every": 16, "sample_max": 1024}
    [rank] = doc["summary"]["ranks"]
    assert rank["rank"] == 3 and rank["gpu_kernels"] == 19
    # Communication time is the time covered by at least one collective (stand-in kernels may overlap).
    covered, end = 0.0, float("-inf")
    for event in sorted((e for e in kernels if e["name"].startswith("nccl:")), key=lambda e: e["ts"]):
        start, stop = max(event["ts"], end), event["ts"] + event["dur"]
        covered += max(0.0, stop - start)
        end = max(end, stop)
    assert rank["communication_us"] == pytest.approx(covered, abs=0.01)
    assert rank["communication_us"] <= sum(count * us for count, us in COLLECTIVES.values())


def test_duration_dump_holds_only_events_inside_the_window(agent, workload, tmp_path):
    # The workload finished its ops before READY, so a window opened now sees none of them.
    result = run_cli("trace", agent.address.target, "--kind", "timeline", "--duration-ms", "300",
                     "--pids", str(workload.pid), "--output", str(tmp_path), "--fetch", "all", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    [target] = json.loads(result.stdout)["hosts"][0]["targets"]
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    assert [e for e in trace["traceEvents"] if e.get("cat") == "kernel"] == []


@pytest.fixture
def hostile_home() -> Iterator[tuple[tuple[int, int], pathlib.Path]]:
    """The attacker (a real unprivileged user) and a folder of theirs (HOME and --output)."""
    user = hostile_user()
    base = pathlib.Path(tempfile.mkdtemp(prefix="tpt", dir="/tmp"))
    base.chmod(0o711)
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, *user)
    yield user, home
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def hostile_sleepers(hostile_home) -> Iterator[list[subprocess.Popen]]:
    """Two live processes of the attacker, to name forged segments after."""
    user, _ = hostile_home
    started = [subprocess.Popen(as_user(user, ["sleep", "300"])) for _ in range(2)]
    try:
        for proc in started:
            wait_for(lambda: procfs.real_uid(proc.pid) == user[0])  # noqa: B023  (waited on at once)
        yield started
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=10)


def timeline_targets(agent, output: pathlib.Path, *args: str, user=None, home=None) -> list[dict]:
    result = run_cli("trace", agent.address.target, "--kind", "timeline", "--last-events", "100",
                     "--output", str(output), "--json", *args, user=user, home=home)
    doc = json.loads(result.stdout)
    return doc["hosts"][0]["targets"]


def test_forged_segments_are_never_dumped_and_a_user_gets_only_their_own(agent, workload, hostile_home,
                                                                        hostile_sleepers, tmp_path):
    user, home = hostile_home
    uid = user[0]
    mine, reused = hostile_sleepers
    real = segment_path(workload.pid).read_bytes()  # root's rank 3: any valid segment bytes will do
    shm = pathlib.Path(segment.SEGMENT_DIR)
    forgeries = [
        # root's rank's events under the attacker's own process (the header still names root's pid)
        plant(shm, f"tuiprof-{uid}-{mine.pid}", real, user),
        # root's process claimed as the attacker's
        plant(shm, f"tuiprof-{uid}-{workload.pid}", forged(real, workload.pid), user),
        # a segment "from before" a process that now has its pid (started an hour before it)
        plant(shm, f"tuiprof-{uid}-{reused.pid}", forged(real, reused.pid, time.time_ns() - 3600 * 10**9), user),
    ]
    try:
        every_claim = "--pids", f"{workload.pid},{mine.pid},{reused.pid}"  # other tests' ranks may be live
        everything = timeline_targets(agent, tmp_path, *every_claim)
        assert [(t["pid"], t["state"]) for t in everything] == [(workload.pid, "written")]
        assert everything[0]["file"].startswith("timeline/0/")
        for pid in (mine.pid, reused.pid):
            assert timeline_targets(agent, tmp_path, "--pids", str(pid)) == []
        # The attacker asking as themself: root's rank refused, no forgery dumped for them either.
        theirs = timeline_targets(agent, home, *every_claim, user=user, home=home)
        assert [(t["pid"], t["state"]) for t in theirs] == [(workload.pid, "refused")]
        assert f"belongs to uid 0; you (uid {uid})" in theirs[0]["reason"]
        assert not (agent.trace_dir / "timeline" / str(uid)).exists()
        assert "rank segments refused for a timeline" in agent.log()
    finally:
        for path in forgeries:
            path.unlink()
