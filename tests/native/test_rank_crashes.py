"""Ranks that die: real torch CPU processes under `tuiprof run` that raise, abort,
segfault or exit with a code, read back through a real agentd (Watch and
`tuiprof status --json`); a live rank whose thread died; the programs end
exactly as they would without tuiprof; the exception file is read safely and
cleaned up with its segment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

from agentd.collectors.rank_files import SidecarFile
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import segment_path, tuiprof_run, watch_rank, watch_snapshot
from testkit.agents import running_agent
from tuiprof_native import segment

WORKER = os.path.join(os.path.dirname(__file__), "crash_worker.py")
# name: (worker mode, rank, extra environment); "faulthandler" segfaults with Python's faulthandler on
CASES = {"raise": ("raise", 0, {}), "abort": ("abort", 1, {}), "segv": ("segv", 2, {}), "exit3": ("exit3", 3, {}),
         "faulthandler": ("segv", 4, {"PYTHONFAULTHANDLER": "1"}), "early": ("early", 5, {})}


def _start(mode: str, rank: int, job: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return tuiprof_run(sys.executable, WORKER, mode, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env={"RANK": str(rank), "TUIPROF_JOB_ID": job, "OMP_NUM_THREADS": "1", **(env or {})})


async def test_dead_ranks_report_their_exit_code_signal_and_exception(tmp_path, cleanup_segments):
    job = f"crash-{uuid.uuid4().hex[:8]}"
    procs = {name: _start(mode, rank, job, env) for name, (mode, rank, env) in CASES.items()}
    cleanup_segments.extend(p.pid for p in procs.values())
    stderr = {mode: proc.communicate(timeout=120)[1] for mode, proc in procs.items()}
    # the programs end as they would without tuiprof: same status, the program's own hook still ran
    assert {m: p.returncode for m, p in procs.items()} == {
        "raise": 1, "abort": -signal.SIGABRT, "segv": -signal.SIGSEGV, "exit3": 3, "faulthandler": -signal.SIGSEGV,
        "early": 1}
    assert "custom hook saw RuntimeError" in stderr["raise"]
    assert "Fatal Python error: Segmentation fault" in stderr["faulthandler"]  # its report still written
    assert stderr["raise"].rstrip().endswith("RuntimeError: boom while loading batch 7")
    early = segment_path(procs.pop("early").pid)  # a process that never trained is no rank: nothing left behind
    assert not early.exists() and not early.with_name(early.name + segment.EXCEPTION_SUFFIX).exists()
    pids = {p.pid: m for m, p in procs.items()}
    with running_agent(tmp_path) as agent:
        snapshot = await watch_snapshot(agent, lambda s: {r.pid for r in s.ranks if r.state == pb.RANK_STATE_EXITED} >= set(pids)
                                        and set(pids) <= {v.pid for v in s.hang.ranks})
        status = subprocess.run([sys.executable, "-m", "tuiprof.cli", "status", f"127.0.0.1:{agent.port}", "--json"],
                                capture_output=True, text=True, timeout=60)
    ranks = {pids[r.pid]: r for r in snapshot.ranks if r.pid in pids}
    assert ranks["raise"].exit_code == 1 and not ranks["raise"].HasField("exit_signal")
    assert 'in load_batch\n    raise RuntimeError("boom while loading batch 7")' in ranks["raise"].exception
    assert ranks["raise"].exception.startswith("Traceback (most recent call last):")
    assert ranks["abort"].exit_signal == signal.SIGABRT and not ranks["abort"].HasField("exit_code")
    assert ranks["segv"].exit_signal == ranks["faulthandler"].exit_signal == signal.SIGSEGV
    assert ranks["exit3"].exit_code == 3 and not ranks["exit3"].HasField("exit_signal")
    assert [ranks[m].exception for m in ("abort", "segv", "exit3")] == ["", "", ""]
    verdicts = {pids[v.pid]: v.explanation for v in snapshot.hang.ranks if v.pid in pids}
    assert verdicts == {
        "raise": "rank 0: exited with code 1 after an uncaught exception: RuntimeError: boom while loading batch 7",
        "abort": "rank 1: killed by signal 6 (SIGABRT)",
        "segv": "rank 2: killed by signal 11 (SIGSEGV)",
        "exit3": "rank 3: exited with code 3",
        "faulthandler": "rank 4: killed by signal 11 (SIGSEGV)",
    }
    assert status.returncode == 0, status.stderr
    shown = {r["pid"]: r for h in json.loads(status.stdout)["hosts"] for r in h["ranks"] if r["pid"] in pids}
    assert shown[procs["abort"].pid]["exit_signal"] == signal.SIGABRT
    assert shown[procs["raise"].pid]["exception"] == ranks["raise"].exception


async def test_a_thread_that_dies_is_reported_while_the_rank_lives(tmp_path, cleanup_segments):
    proc = _start("thread", 5, f"crash-{uuid.uuid4().hex[:8]}")
    cleanup_segments.append(proc.pid)
    try:
        assert proc.stdout.readline().strip() == "alive"
        with running_agent(tmp_path) as agent:
            rank = await watch_rank(agent, proc.pid, lambda r: bool(r.exception))
        assert rank.state == pb.RANK_STATE_RUNNING
        assert rank.exception.startswith("Exception in thread prefetcher:\nTraceback")
        assert rank.exception.rstrip().endswith("ValueError: bad sample in prefetcher")
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "Exception in thread prefetcher" in err  # threading's own report still printed


async def test_a_sigterm_the_program_handles_is_handled_and_not_reported_as_its_end(tmp_path, cleanup_segments):
    proc = _start("term", 6, f"crash-{uuid.uuid4().hex[:8]}")
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)  # reaches the hook's handler first, which hands it to the program's
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "SIGTERM handled, exiting cleanly" in out
    with running_agent(tmp_path) as agent:
        rank = await watch_rank(agent, proc.pid, lambda r: r.state == pb.RANK_STATE_EXITED)
    assert rank.exit_code == 0 and not rank.HasField("exit_signal")


def test_the_exception_file_goes_with_its_segment(tmp_path, cleanup_segments):
    proc = _start("raise", 0, f"crash-{uuid.uuid4().hex[:8]}")
    cleanup_segments.append(proc.pid)
    proc.communicate(timeout=120)
    source = segment_path(proc.pid)
    shutil.copy(source, tmp_path / source.name)
    shutil.copy(f"{source}{segment.EXCEPTION_SUFFIX}", tmp_path / f"{source.name}{segment.EXCEPTION_SUFFIX}")
    collector = RanksCollector(0.1, directory=str(tmp_path), exited_keep_seconds=0.2)
    try:
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        (rank,) = snapshot.ranks
        assert rank.state == pb.RANK_STATE_EXITED and "RuntimeError: boom" in rank.exception
        time.sleep(0.25)
        collector.collect()
        assert sorted(os.listdir(tmp_path)) == []
    finally:
        collector.close()


def test_an_exception_file_that_is_a_link_or_a_fifo_is_not_read(tmp_path, caplog):
    seg = tmp_path / "tuiprof-0-1"
    seg.write_bytes(b"")
    secret = tmp_path / "secret"
    secret.write_text("not for the agent")
    exception = SidecarFile(str(seg), ".exception")
    os.symlink(secret, exception.path)
    assert exception.refresh({exception.path}) == ""
    os.unlink(exception.path)
    os.mkfifo(exception.path)
    assert exception.refresh({exception.path}) == ""  # opened non-blocking, then refused: not a regular file
    assert "not a regular file" in caplog.text
    os.unlink(exception.path)
    with open(exception.path, "w") as f:
        f.write("Traceback (most recent call last):\nKeyError: 'x'\n")
    assert exception.refresh({exception.path}).endswith("KeyError: 'x'\n")
