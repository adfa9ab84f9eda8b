"""The NCCL API fallback of libtuiprof_hook.so (nccl_fallback.c): collectives
of an NCCL that did not take the profiler plugin, seen at ncclAllReduce & co.

A Python job (nccl_job.py) calls a stand-in NCCL (standins/nccl_api.c)
through ctypes under `tuiprof run`: by default an NCCL 2.21.5 without the
plugin interface; built with -DSTANDIN_PROFILER an NCCL 2.28 that loads the
plugin.  The job's mix is fixed, so every count, byte figure and (with the
stand-in CUDA runtime's virtual GPU clock) every duration is known: an op's
kernel takes 20 us + its local bytes at 1 ns each, and a group's ops run back
to back at ncclGroupEnd."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from agentd.collectors.ranks import RanksCollector
from agentd.hang.detector import HangDetector, Thresholds
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import STANDINS, build_cuda_standins, gcc, segment_path, tuiprof_run, wait_for
from tuiprof.analysis.rank_health import hook_reasons
from tuiprof.model.messages import HostSnapshot
from tuiprof_native import segment

JOB = pathlib.Path(__file__).parent / "nccl_job.py"
OP_NS = 20_000
# (op, dtype, count, bytes per op (nccl-tests size), local bytes per op, ops in its group)
OPS = [
    ("AllReduce", "bf16", 3, 2048, 2048, 1),
    ("AllGather", "fp32", 2, 4096, 1024, 1),
    ("ReduceScatter", "fp32", 1, 8192, 2048, 1),
    ("Broadcast", "int8", 2, 100, 100, 1),  # one alone, one alone in a group
    ("Reduce", "fp64", 1, 80, 80, 1),
    ("Send", "int8", 1, 100, 100, 2),       # Send + Recv in one (nested) group
    ("Recv", "int8", 1, 100, 100, 2),
    ("AllReduce", "fp32", 3, 256, 256, 3),  # three coalesced in one group
]
TOTAL_OPS = sum(op[2] for op in OPS)
CODES = {"init": 0, "failing_call": 5, "failing_group": 2, "null_comm": 4, "end_without_start": 5}


def djb2a(data: bytes) -> int:
    """NCCL's communicator hash of its unique id (as NCCL's getHash computes it)."""
    h = 5381
    for byte in data:
        h = (((h << 5) + h) ^ (byte - 256 if byte > 127 else byte)) & (2**64 - 1)
    return h


COMM_HASH = djb2a(bytes(range(1, 129)))  # the job's unique id


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """libcuda.so.1, libcudart.so, libnccl_old.so (2.21.5, no plugin), libnccl_new.so (2.28, loads the plugin)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in GPU libraries")
    out = tmp_path_factory.mktemp("nccl_api")
    build_cuda_standins(out)
    gcc("-shared", "-fPIC", "-o", str(out / "libnccl_old.so"), str(STANDINS / "nccl_api.c"))
    gcc("-shared", "-fPIC", "-o", str(out / "libncclprof.so"), str(STANDINS / "nccl.c"), "-ldl", "-lpthread")
    gcc("-DSTANDIN_PROFILER", "-shared", "-fPIC", "-o", str(out / "libnccl_new.so"), str(STANDINS / "nccl_api.c"),
        f"-L{out}", "-lncclprof", "-Wl,-rpath,$ORIGIN")
    return out


def console_reasons(snapshot: pb.HostSnapshot, pid: int) -> list[str]:
    """The hook sentences the console shows for the rank ``pid`` of an agent snapshot."""
    [rank] = [r for r in HostSnapshot.from_proto(snapshot).ranks if r.pid == pid]
    return hook_reasons(rank.hook)


def start_job(libs: pathlib.Path, cleanup: list[int], nccl: str, *extra: str, hooked: bool = True,
              options: tuple[str, ...] = ()) -> tuple[dict, subprocess.Popen]:
    """The job up to READY: (its JSON line, the process)."""
    cmd = [sys.executable, str(JOB), str(libs), nccl, *extra]
    if hooked:
        proc = tuiprof_run(*cmd, options=options, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env={"TUIPROF_NCCL_FALLBACK": ""})
    else:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    cleanup.append(proc.pid)
    result = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "READY"
    return result, proc


def finish(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=20) == 0


def nccl_slots(seg) -> dict:
    return {(s.op, s.dtype): s for s in seg.slots() if s.kind == "nccl"}


def all_recorded(seg) -> bool:
    return sum(s.count for s in nccl_slots(seg).values()) == TOTAL_OPS


def check_counts(seg) -> None:
    slots = nccl_slots(seg)
    assert sorted(slots) == sorted((op, dtype) for op, dtype, *_ in OPS)
    for op, dtype, count, size, _, _ in OPS:
        s = slots[(op, dtype)]
        assert (s.count, s.bytes, s.nranks, s.comm_hash) == (count, count * size, 4, COMM_HASH), s
    events = [e for e in seg.events() if e.kind == "nccl"]
    assert all(e.rank == 1 for e in events)
    # NCCL numbers each communicator's ops per kind from 0; the fallback does the same
    assert [e.op_seq for e in events if e.op == "AllReduce"] == list(range(6))
    assert [e.op_seq for e in events if e.op == "Broadcast"] == [0, 1]


def test_counted_only_by_default_and_results_untouched(libs, cleanup_segments):
    plain, proc = start_job(libs, cleanup_segments, "libnccl_old.so", hooked=False)
    finish(proc)
    result, proc = start_job(libs, cleanup_segments, "libnccl_old.so")
    collector = RanksCollector(0.1)
    try:
        # every call reached NCCL once and returned NCCL's own code (failures, a NULL comm included)
        assert result["codes"] == plain["codes"] == CODES
        assert result["standin_calls"] == plain["standin_calls"]
        assert result["cuda_events"] == 0  # counting only: no CUDA call on any stream
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: all_recorded(seg)), seg.slots()
            header = seg.header()
            assert header.flags & segment.FLAG_NCCL_API
            assert not header.flags & (segment.FLAG_NCCL_API_EVENTS | segment.FLAG_NCCL_PLUGIN)
            check_counts(seg)
            assert all(s.timed_count == 0 and s.algo == "" for s in nccl_slots(seg).values())
            assert header.counters.nccl_untimed == TOTAL_OPS
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        [rank] = [r for r in snapshot.ranks if r.pid == proc.pid]
        assert rank.hook.nccl_api_fallback and not rank.hook.nccl_api_events
        assert {(n.op, n.dtype): n.count_total for n in rank.nccl} == {(op, dtype): n for op, dtype, n, *_ in OPS}
        assert not any(n.HasField("busbw_bytes_per_s") for n in rank.nccl)  # counted, never timed
        assert console_reasons(snapshot, proc.pid) == [
            "NCCL did not take the profiler plugin: collectives counted at its API, not timed "
            "(`tuiprof run --nccl-fallback` times them on their stream)"]
    finally:
        collector.close()
        finish(proc)


def test_timed_on_the_stream_with_nccl_fallback(libs, cleanup_segments):
    result, proc = start_job(libs, cleanup_segments, "libnccl_old.so", options=("--nccl-fallback",))
    collector = RanksCollector(0.1)
    try:
        assert result["codes"] == CODES
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: all_recorded(seg)), seg.slots()
            header = seg.header()
            assert header.flags & segment.FLAG_NCCL_API and header.flags & segment.FLAG_NCCL_API_EVENTS
            assert not header.flags & segment.FLAG_NCCL_PLUGIN
            check_counts(seg)
            slots = nccl_slots(seg)
            for op, dtype, count, _, local, grouped in OPS:
                s = slots[(op, dtype)]
                # a group is one span: its ops ran back to back, each carries the whole span
                span = OP_NS + local if grouped == 1 else {2: 2 * (OP_NS + 100), 3: 3 * (OP_NS + 256)}[grouped]
                assert s.algo == ("group" if grouped > 1 else "")
                assert (s.timed_count, s.min_ns, s.max_ns, s.total_ns) == (count, span, span, count * span), s
            assert header.counters.nccl_untimed == 0
            assert seg.inflight() == []
            proc.stdin.write("stall\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "STALLED"
            assert wait_for(lambda: seg.inflight())
            [entry] = seg.inflight()
            assert (entry.kind, entry.op, entry.key, entry.op_seq, entry.pending) == ("nccl", "AllReduce", COMM_HASH,
                                                                                      6, 1)
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        [rank] = [r for r in snapshot.ranks if r.pid == proc.pid]
        [inflight] = rank.inflight
        assert (inflight.kind, inflight.op, inflight.comm_hash, inflight.sequence) == ("nccl", "AllReduce",
                                                                                     f"{COMM_HASH:x}", 6)
        assert rank.hook.pending == 1 and not rank.hook.nccl_plugin
        assert rank.hook.nccl_api_fallback and rank.hook.nccl_api_events
        assert console_reasons(snapshot, proc.pid) == [
            "NCCL did not take the profiler plugin: collectives timed by CUDA events on their stream "
            "(from the op's turn on the stream to its end, launch gaps included; not kernel time)"]
        allreduce = next(n for n in rank.nccl if (n.op, n.dtype, n.algorithm) == ("AllReduce", "bf16", ""))
        assert allreduce.count_total == 3 and allreduce.comm_size == 4
        # the hang detector: the op in flight for longer than its timeout, watched that long
        now = [1000.0]
        detector = HangDetector(Thresholds(suspect_s=0.2, hang_s=0.5), clock=lambda: now[0])
        detector.observe([rank])
        time.sleep(0.6)
        now[0] += 10
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        status = detector.observe([r for r in snapshot.ranks if r.pid == proc.pid])
        assert status.level == pb.HANG_LEVEL_HUNG, status
        assert "AllReduce #6 on comm" in status.explanation and "not finished" in status.explanation, status
    finally:
        collector.close()
        finish(proc)


def test_inactive_when_nccl_takes_the_plugin(libs, cleanup_segments):
    result, proc = start_job(libs, cleanup_segments, "libnccl_new.so", options=("--nccl-fallback",))
    try:
        assert result["codes"] == CODES
        assert result["cuda_events"] == 0  # no event on the NCCL stream: the plugin's GPU timers only
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: all_recorded(seg)), seg.slots()
            header = seg.header()
            assert header.flags & segment.FLAG_NCCL_PLUGIN
            assert not header.flags & (segment.FLAG_NCCL_API | segment.FLAG_NCCL_API_EVENTS)
            slots = nccl_slots(seg)
            assert {k: s.count for k, s in slots.items()} == {(op, dtype): n for op, dtype, n, *_ in OPS}  # once
            assert slots[("AllReduce", "bf16")].algo == "RING"  # the plugin's record, not the fallback's
    finally:
        finish(proc)


def test_without_cuda_timed_mode_counts(libs, cleanup_segments):
    """No CUDA runtime in the process: no events to take, the ops are counted, the calls unharmed."""
    result, proc = start_job(libs, cleanup_segments, "libnccl_old.so", "no-cuda", options=("--nccl-fallback",))
    collector = RanksCollector(0.1)
    try:
        assert result["codes"] == CODES
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: all_recorded(seg)), seg.slots()
            check_counts(seg)
            assert all(s.timed_count == 0 for s in nccl_slots(seg).values())
            assert seg.header().counters.nccl_untimed == TOTAL_OPS
            assert not seg.header().flags & segment.FLAG_CUDA_TIMING
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        assert console_reasons(snapshot, proc.pid)[1:] == [f"{TOTAL_OPS} collectives finished without GPU timestamps: "
                                                           "no CUDA events"]
    finally:
        collector.close()
        finish(proc)
