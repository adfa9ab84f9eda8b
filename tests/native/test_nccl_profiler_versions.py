"""The hook as NCCL's profiler plugin in every API version NCCL has had (v1, NCCL 2.23, to v6,
2.29-2.30), and chained to a second plugin that NCCL_PROFILER_PLUGIN named.

A C driver (standins/nccl_profiler_driver.c), compiled against NCCL's own profiler headers
(nccl_profiler_headers/, from NCCL's ext-profiler example), loads the plugin named by
NCCL_PROFILER_PLUGIN and drives it as NCCL of one version does: the symbol looked up newest
first, that version's init and descriptors, a fixed program of collectives and p2p ops with their
proxy and kernel-channel events. The counts, sizes and times in the segment are checked against
that program; the second plugin (standins/counting_profiler.c) counts what reaches it."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import HOOK, STANDINS, gcc, remove_rank_files, segment_path, tuiprof_run, wait_for
from tuiprof.commands.run import CHAINED_PLUGIN_ENV, launch_environment
from tuiprof_native import segment

HEADERS = pathlib.Path(__file__).parent / "nccl_profiler_headers"
NRANKS, RANK = 4, 1
# (op, dtype, algo, proto, times, bytes per op (nccl-tests size), channels, GPU ns): the driver's program
PROGRAM = [
    ("AllReduce", "bf16", "RING", "SIMPLE", 3, 1024 * 2, 2, 50_000),
    ("AllGather", "fp32", "RING", "LL", 2, 256 * 4 * NRANKS, 1, 20_000),
    ("Send", "int8", "", "", 2, 100, 1, 5_000),
]
CE_OP = ("AlltoAll", "fp32", "CE", "", 1, 64 * 4)  # v6: on copy engines, untimed
BROADCAST_OP = ("Broadcast", "fp32", "", "", 2, 128 * 4)  # v6: from its API event (once with a Coll event too), untimed
OPS = sum(p[4] for p in PROGRAM)
CHANNELS = sum(p[4] * p[6] for p in PROGRAM)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The driver (over a stand-in libnccl for ncclCommInitRank) and the counting plugin in v3, v4, v5."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the profiler driver")
    out = tmp_path_factory.mktemp("nccl_profiler")
    gcc("-shared", "-fPIC", "-o", str(out / "libnccl.so"), str(STANDINS / "nccl_api.c"))
    gcc(f"-I{HEADERS}", "-o", str(out / "driver"), str(STANDINS / "nccl_profiler_driver.c"), f"-L{out}", "-lnccl",
        "-ldl", f"-Wl,-rpath,{out}")
    for version in (3, 4, 5):
        gcc(f"-DCHAIN_VERSION={version}", f"-I{HEADERS}", "-shared", "-fPIC",
            "-o", str(out / f"libcounting_v{version}.so"), str(STANDINS / "counting_profiler.c"))
    return out


def drive(built: pathlib.Path, version: int, env: dict[str, str] | None = None):
    """Run the driver in `version` under `tuiprof run` up to READY: (its JSON line, the process)."""
    proc = tuiprof_run(str(built / "driver"), str(version), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       env=env or {})
    line = proc.stdout.readline()
    assert line, f"the driver ended: {proc.wait(timeout=10)}"
    assert proc.stdout.readline().strip() == "READY"
    return json.loads(line), proc


def finish(proc: subprocess.Popen) -> None:
    proc.communicate("\n", timeout=10)
    remove_rank_files(proc.pid)
    assert proc.returncode == 0


def expected_ops(version: int) -> list[tuple]:
    return [p[:6] for p in PROGRAM] + ([CE_OP, BROADCAST_OP] if version >= 6 else [])


def check_segment(seg: segment.Segment, version: int, comm_hash: int) -> None:
    """Every op of the program, once, with its sizes, communicator and (where the version gives it) time."""
    ops = expected_ops(version)
    assert wait_for(lambda: sum(s.count for s in seg.slots() if s.kind == "nccl") == sum(o[4] for o in ops)), \
        seg.slots()
    header = seg.header()
    assert header.flags & segment.FLAG_NCCL_PLUGIN
    assert header.nccl_profiler_api == version  # the hook's health says which API NCCL took
    assert bool(header.flags & segment.FLAG_NCCL_GPU_TIME) == (version >= 4)  # v3's times are the host's
    counters = header.counters
    assert (counters.nccl_channel_shortfall, counters.nccl_late_channels) == (0, 0)
    untimed = sum(o[4] for o in ops) if version <= 2 else (CE_OP[4] + BROADCAST_OP[4] if version >= 6 else 0)
    assert counters.nccl_untimed == untimed
    slots = {s.op: s for s in seg.slots() if s.kind == "nccl"}
    assert sorted(slots) == sorted(o[0] for o in ops)
    for op, dtype, algo, proto, times, size in ops:
        s = slots[op]
        assert (s.dtype, s.algo, s.proto, s.nranks, s.comm_hash) == (dtype, algo, proto, NRANKS, comm_hash)
        assert (s.count, s.bytes) == (times, times * size)
    for op, _, _, _, times, _, _, gpu_ns in PROGRAM:
        s = slots[op]
        if version <= 2:
            assert s.timed_count == 0  # no kernel events before v3
        elif version == 3:
            assert s.timed_count == times and s.min_ns >= gpu_ns  # the proxy thread saw the kernel run
        else:
            assert (s.timed_count, s.min_ns, s.max_ns, s.total_ns) == (times, gpu_ns, gpu_ns, times * gpu_ns)
    allreduce = [e for e in seg.events() if e.op == "AllReduce"]
    assert [e.op_seq for e in allreduce] == [0, 1, 2]
    assert all(e.rank == RANK for e in allreduce)
    if version >= 6:  # numbered as NCCL numbers them, though counted from the API event
        assert [e.op_seq for e in seg.events() if e.op == "Broadcast"] == [0, 1]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_every_profiler_api_version_counts_the_program_exactly(built, version):
    result, proc = drive(built, version)
    try:
        assert (result["symbol"], result["chosen"], result["chain"]) == (f"ncclProfiler_v{version}", version, "")
        with segment.Segment(segment_path(proc.pid)) as seg:
            check_segment(seg, version, result["comm_hash"])
            assert seg.inflight() == []
    finally:
        finish(proc)


def agents_hook_health(pid: int) -> pb.HookHealth:
    collector = RanksCollector(0.1)
    try:
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
    finally:
        collector.close()
    [rank] = [r for r in snapshot.ranks if r.pid == pid]
    return rank.hook


def check_header_chain(in_header: str, status: str) -> None:
    """The segment header's copy of the chain status: whole, or (longer than its 95 characters) with the
    middle of the path elided and the verdict at its end kept."""
    if len(status) <= 95:
        assert in_header == status
    else:
        head, tail = in_header.split("...")
        assert len(in_header) == 95 and status.startswith(head) and status.endswith(tail), in_header


def chained_expectation(version: int) -> dict[str, int]:
    """What the counting plugin receives from the program, by event type (NCCL's mask bits)."""
    kernel = CHANNELS if version >= 3 else 0
    starts = {"1": OPS, "2": OPS - 2, "4": 2, "8": CHANNELS, "64": kernel}  # Group, Coll, P2p, ProxyOp, KernelCh
    if version >= 5:  # the API events; a v6 NCCL's copy-engine op has them too, its CeColl is not passed on
        # a v6 NCCL's two Broadcasts: their API events, and one Coll event (the other has none)
        extra = 1 + BROADCAST_OP[4] if version >= 6 else 0
        starts.update({"256": OPS + extra, "512": OPS - 2 + extra, "1024": 2})
        starts["2"] += 1 if version >= 6 else 0
    return starts


@pytest.mark.parametrize(("version", "chained"), [(3, 3), (4, 4), (5, 5), (6, 5)])
def test_a_plugin_named_before_is_chained_and_gets_its_events(built, tmp_path, version, chained):
    plugin = built / f"libcounting_v{chained}.so"
    counts = tmp_path / "counts.jsonl"
    result, proc = drive(built, version, env={"NCCL_PROFILER_PLUGIN": str(plugin),
                                              "COUNTING_PROFILER_OUT": str(counts)})
    try:
        assert result["chain"] == f"chains to {plugin} (ncclProfiler_v{chained})"
        with segment.Segment(segment_path(proc.pid)) as seg:
            check_segment(seg, version, result["comm_hash"])
            check_header_chain(seg.header().nccl_chain, result["chain"])
        hook = agents_hook_health(proc.pid)  # what status --json and the ranks tab show
        assert hook.nccl_profiler_api == version
        check_header_chain(hook.nccl_profiler_chain, result["chain"])
    finally:
        finish(proc)
    (received,) = [json.loads(line) for line in counts.read_text().splitlines()]
    starts = {k: v for k, v in received["starts"].items() if v}
    assert starts == chained_expectation(version)
    assert (received["inits"], received["finalizes"]) == (1, 1)
    assert received["stops"] == sum(starts.values())
    assert received["kernel_stops"] == (CHANNELS if version >= 4 else 0)
    assert (received["foreign_parents"], received["bad_handles"], received["bad_contexts"]) == (0, 0, 0)


def test_a_plugin_without_the_version_nccl_speaks_is_not_chained_and_says_why(built, tmp_path):
    plugin = built / "libcounting_v3.so"
    counts = tmp_path / "counts.jsonl"
    result, proc = drive(built, 5, env={"NCCL_PROFILER_PLUGIN": str(plugin), "COUNTING_PROFILER_OUT": str(counts)})
    try:
        assert result["chain"] == f"not chained to {plugin}: it has no ncclProfiler_v5, the version NCCL speaks here"
        with segment.Segment(segment_path(proc.pid)) as seg:
            check_segment(seg, 5, result["comm_hash"])
            check_header_chain(seg.header().nccl_chain, result["chain"])
    finally:
        finish(proc)
    assert not counts.exists()  # never initialised


def test_a_bare_plugin_name_is_found_as_nccl_finds_it(built, tmp_path):
    (tmp_path / "libnccl-profiler-counting.so").symlink_to(built / "libcounting_v5.so")
    counts = tmp_path / "counts.jsonl"
    result, proc = drive(built, 5, env={"NCCL_PROFILER_PLUGIN": "counting", "LD_LIBRARY_PATH": str(tmp_path),
                                        "COUNTING_PROFILER_OUT": str(counts)})
    try:
        assert result["chain"].startswith("chains to ") and result["chain"].endswith(" (ncclProfiler_v5)")
    finally:
        finish(proc)
    assert json.loads(counts.read_text())["inits"] == 1


def test_tuiprof_run_moves_the_users_plugin_to_the_chain_and_keeps_none(capsys):
    env = launch_environment({"NCCL_PROFILER_PLUGIN": "inspector"}, kineto_daemon=False)
    assert (env["NCCL_PROFILER_PLUGIN"], env[CHAINED_PLUGIN_ENV]) == (str(HOOK), "inspector")
    assert "chains to NCCL_PROFILER_PLUGIN=inspector" in capsys.readouterr().err
    mine = launch_environment({"NCCL_PROFILER_PLUGIN": str(HOOK)}, kineto_daemon=False)  # a nested tuiprof run
    assert CHAINED_PLUGIN_ENV not in mine
    none = launch_environment({"NCCL_PROFILER_PLUGIN": "None"}, kineto_daemon=False)  # NCCL: no plugin at all
    assert none["NCCL_PROFILER_PLUGIN"] == "None" and CHAINED_PLUGIN_ENV not in none
