"""Hostile files in the segment directory, against the ranks collector as the agent runs it (root).

Real files (owned by a real second user where the attack needs one), real processes
(root's and that user's), a real rank under `tuiprof run` beside every attack: each
hostile file is refused (skipped, counted per reason, never reported) and the good
rank is still reported next to it.
"""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agentd import procfs
from agentd.collectors import rank_claims, rank_function_requests, rank_functions
from agentd.collectors.ranks import RanksCollector
from agentd.hang.detector import HangDetector, Thresholds
from agentd.prometheus import render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from native.segment_forge import STEP_COUNT_OFFSET, forged, plant, recorded_segment
from native.support import SMALL_SHM_SETUP, remove_rank_files, segment_path, tuiprof_run, tuiprof_run_argv
from tuiprof_native import segment

ME = os.getuid()  # the test's own user: what the good ranks run as and the files it plants claim
HOSTILE = "tuiprof-hostile"
GOOD_RANK = ("import ctypes, os, sys; lib = ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']); "
             "lib.tuiprof_record_step(); print('ready', flush=True); sys.stdin.readline()")


@pytest.fixture(scope="module")
def hostile() -> tuple[int, int]:
    """(uid, gid) of a real unprivileged user, created when missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent runs as root, and the attacks need files and processes of a second user")
    try:
        entry = pwd.getpwnam(HOSTILE)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", HOSTILE], check=True)
        entry = pwd.getpwnam(HOSTILE)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="module")
def valid_bytes() -> bytes:
    return recorded_segment()


@pytest.fixture(scope="module")
def good_rank() -> Iterator[subprocess.Popen]:
    """A live rank under `tuiprof run` (root's), waiting on stdin."""
    proc = tuiprof_run(sys.executable, "-c", GOOD_RANK, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.communicate("\n", timeout=10)
    remove_rank_files(proc.pid)


@pytest.fixture
def shm_dir(good_rank) -> Iterator[pathlib.Path]:
    """A segment directory on /dev/shm's tmpfs holding the good rank's segment (a hard link)."""
    path = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    os.link(segment_path(good_rank.pid), path / segment_path(good_rank.pid).name)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `sleep` processes (as root, or as another user with setpriv); all killed at the end."""
    started: list[subprocess.Popen] = []

    def start(user: tuple[int, int] | None = None) -> subprocess.Popen:
        prefix = [] if user is None else ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
        proc = subprocess.Popen([*prefix, "sleep", "300"])
        started.append(proc)
        deadline = time.monotonic() + 10  # setpriv execs sleep: wait until the pid runs as that user
        while procfs.real_uid(proc.pid) != (0 if user is None else user[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def collector(shm_dir) -> Iterator[RanksCollector]:
    ranks = RanksCollector(0.1, directory=str(shm_dir), exited_keep_seconds=60)
    yield ranks
    ranks.close()


def reported_all(collector: RanksCollector) -> list[pb.RankStats]:
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return list(snapshot.ranks)


def reported(collector: RanksCollector) -> dict[int, pb.RankStats]:
    return {r.pid: r for r in reported_all(collector)}


def test_a_copy_claiming_roots_process_is_refused(collector, shm_dir, good_rank, valid_bytes, hostile, processes):
    root_process = processes()
    mine = processes(hostile)
    # the attack of issue 10: the user's own name, the header pointing at root's process
    plant(shm_dir, f"tuiprof-{hostile[0]}-{root_process.pid}", forged(valid_bytes, root_process.pid), hostile)
    # ... named as root's segment, but owned by the user
    plant(shm_dir, f"tuiprof-0-{root_process.pid}", forged(valid_bytes, root_process.pid), hostile)
    # ... the user's own live process in the name, root's pid in the header
    plant(shm_dir, f"tuiprof-{hostile[0]}-{mine.pid}", forged(valid_bytes, root_process.pid), hostile)
    ranks = reported(collector)
    assert set(ranks) == {good_rank.pid}  # root's process is not a rank: GetStacks cannot reach it
    assert collector.refused() == {rank_claims.PROCESS_UID: 1, rank_claims.OWNER: 1, rank_claims.HEADER_PID: 1}
    assert ranks[good_rank.pid].state == pb.RANK_STATE_RUNNING and ranks[good_rank.pid].step_count == 1


def test_refusals_per_reason_reach_the_snapshot_and_metrics(collector, shm_dir, valid_bytes, hostile, processes):
    root_process = processes()
    plant(shm_dir, f"tuiprof-0-{root_process.pid}", forged(valid_bytes, root_process.pid), hostile)
    plant(shm_dir, f"tuiprof-{ME}-{procfs.pid_max()}", valid_bytes)
    collector.collect()
    snapshot = pb.HostSnapshot(hostname="h")
    collector.fill(snapshot)
    # every reason code, in the fixed order, 0 where nothing was refused: the admin's alert needs no absent series
    assert [(e.reason, e.files) for e in snapshot.rank_segments_refused] == [
        (reason, {rank_claims.OWNER: 1, rank_claims.BAD_NAME: 1}.get(reason, 0)) for reason in rank_claims.REASONS]
    text = render_metrics(snapshot, pb.AgentInfo())
    assert 'tuiprof_rank_segments_refused{hostname="h",reason="owner"} 1\n' in text
    assert 'tuiprof_rank_segments_refused{hostname="h",reason="header-pid"} 0\n' in text


def test_the_users_own_process_is_a_rank(collector, shm_dir, good_rank, valid_bytes, hostile, processes):
    mine = processes(hostile)
    plant(shm_dir, f"tuiprof-{hostile[0]}-{mine.pid}", forged(valid_bytes, mine.pid), hostile)
    ranks = reported(collector)
    assert set(ranks) == {good_rank.pid, mine.pid} and collector.refused() == {}
    assert ranks[mine.pid].state == pb.RANK_STATE_RUNNING
    assert (ranks[mine.pid].uid, ranks[good_rank.pid].uid) == (hostile[0], 0)  # whose private fields they are


def test_a_process_started_after_the_segment_is_not_its_writer(collector, shm_dir, good_rank, valid_bytes,
                                                              processes):
    later = processes()  # a pid reused by a process born after the segment claims to have started
    plant(shm_dir, f"tuiprof-{ME}-{later.pid}", forged(valid_bytes, later.pid, start_ns=time.time_ns() - 3600 * 10**9))
    ranks = reported(collector)
    assert ranks[later.pid].state == pb.RANK_STATE_EXITED  # the claim is about a process that is gone: never a target
    assert not ranks[later.pid].HasField("pmu") and "ESRCH" in ranks[later.pid].unavailable["pmu"]
    assert good_rank.pid in ranks


def test_a_fifo_or_a_link_cannot_block_or_redirect_the_collector(collector, shm_dir, good_rank, hostile):
    fifo = shm_dir / f"tuiprof-{hostile[0]}-77"
    os.mkfifo(fifo)
    os.chown(fifo, *hostile)
    (shm_dir / f"tuiprof-{ME}-78").symlink_to(segment_path(good_rank.pid))
    done = threading.Event()
    result: dict[int, pb.RankStats] = {}
    worker = threading.Thread(target=lambda: (result.update(reported(collector)), done.set()), daemon=True)
    worker.start()
    assert done.wait(timeout=10), "the collector blocked on the FIFO"
    assert set(result) == {good_rank.pid}
    assert collector.refused() == {rank_claims.NOT_REGULAR: 2}


def test_numbers_out_of_range_in_names_are_refused(collector, shm_dir, good_rank, valid_bytes):
    for name in (f"tuiprof-{ME}-{2**32 + 1}", f"tuiprof-{ME}-{procfs.pid_max()}", f"tuiprof-{2**40}-5",
                 f"tuiprof-{ME}-{10**30}.inert"):
        plant(shm_dir, name, valid_bytes)
    assert set(reported(collector)) == {good_rank.pid}
    assert collector.refused() == {rank_claims.BAD_NAME: 4}


def test_a_segment_truncated_between_ticks(collector, shm_dir, good_rank, valid_bytes, processes):
    target = processes()
    path = plant(shm_dir, f"tuiprof-{ME}-{target.pid}", forged(valid_bytes, target.pid))
    assert set(reported(collector)) == {good_rank.pid, target.pid}
    os.truncate(path, len(valid_bytes) // 2)  # while the collector holds it open
    ranks = reported(collector)
    assert set(ranks) == {good_rank.pid} and collector.refused() == {rank_claims.UNREADABLE: 1}
    os.truncate(path, 100)
    assert set(reported(collector)) == {good_rank.pid}


TRUNCATED_UNDER_THE_READER = textwrap.dedent("""
    import sys, time
    from agentd.collectors.ranks import RanksCollector
    collector = RanksCollector(0.1, directory=sys.argv[1])
    ticks, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        collector.collect()
        ticks += 1
    print(ticks, flush=True)
""")


def test_truncation_while_the_collector_reads_never_kills_it(shm_dir, valid_bytes, processes):
    """The agent's own process reads while the file shrinks and grows under it: no SIGBUS."""
    target = processes()
    path = plant(shm_dir, f"tuiprof-{ME}-{target.pid}", forged(valid_bytes, target.pid))
    agent = subprocess.Popen([sys.executable, "-c", TRUNCATED_UNDER_THE_READER, str(shm_dir)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flips = 0
    while agent.poll() is None:
        os.truncate(path, 4096 if flips % 2 == 0 else len(valid_bytes))
        flips += 1
        time.sleep(0.0005)
    out, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, f"collector died with {agent.returncode}: {err[-2000:]}"
    assert int(out) > 10 and flips > 100


def test_an_odd_sequence_left_by_a_dead_writer(collector, shm_dir, good_rank, valid_bytes, processes):
    dead = processes()
    dead.kill()
    dead.wait(timeout=10)
    live = processes()
    plant(shm_dir, f"tuiprof-{ME}-{dead.pid}", forged(valid_bytes, dead.pid, counters_seq=7))
    stuck = plant(shm_dir, f"tuiprof-{ME}-{live.pid}", forged(valid_bytes, live.pid, counters_seq=7))
    started = time.monotonic()
    ranks = reported(collector)
    assert time.monotonic() - started < 2, "a record stuck mid-update must cost a bounded wait"
    assert good_rank.pid in ranks and live.pid not in ranks  # unreadable this interval, not an error for all
    assert ranks[dead.pid].state == pb.RANK_STATE_EXITED
    assert "died while writing its segment" in ranks[dead.pid].unavailable["exit_code"]
    stuck.write_bytes(forged(valid_bytes, live.pid, counters_seq=2))  # the writer finished its update
    assert reported(collector)[live.pid].state == pb.RANK_STATE_RUNNING


def test_a_blank_exception_file_is_no_exception(collector, shm_dir, good_rank):
    name = segment_path(good_rank.pid).name
    (shm_dir / f"{name}{segment.EXCEPTION_SUFFIX}").write_text(" \n\t\n")
    rank = reported(collector)[good_rank.pid]
    assert rank.exception == ""
    exited = pb.RankStats(pid=good_rank.pid, rank=0, state=pb.RANK_STATE_EXITED, exception=rank.exception)
    detector = HangDetector(Thresholds(1.0, 2.0))
    assert detector.observe([exited]).ranks[0].explanation  # the detector judges it (a blank text crashed it)


def test_the_files_beside_a_segment_are_read_and_not_refused_as_names(collector, shm_dir, good_rank):
    """A segment's name with a side file's suffix is no claim of a pid: not counted as a bad name (the
    agent used to count each, every interval), and what it says is reported."""
    name = segment_path(good_rank.pid).name
    beside = {segment.EXCEPTION_SUFFIX: "Traceback (most recent call last):\nKeyError: 'x'\n",
              segment.FLIGHT_SUFFIX: json.dumps({"groups": [{"id": "0", "last_enqueued": 3, "last_completed": 3}],
                                                 "active": []}),
              rank_functions.FUNCTIONS_SUFFIX: json.dumps({"written_ns": 1, "functions": []}),
              rank_function_requests.REQUEST_SUFFIX: "{}"}
    for suffix, text in beside.items():
        (shm_dir / f"{name}{suffix}").write_text(text)
    rank = reported(collector)[good_rank.pid]
    assert collector.refused() == {}
    assert rank.exception.endswith("KeyError: 'x'\n")
    assert [(group.id, group.last_completed) for group in rank.process_groups] == [("0", 3)]
    (shm_dir / f"{name}{segment.EXCEPTION_SUFFIX}").write_text("Traceback (most recent call last):\nOSError\n")
    assert reported(collector)[good_rank.pid].exception.endswith("OSError\n")  # changed: read again


def test_a_segment_that_never_gets_its_magic_is_refused_once(collector, shm_dir, good_rank, hostile, monkeypatch):
    path = shm_dir / f"tuiprof-{hostile[0]}-5"
    path.write_bytes(bytes(segment.SEGMENT_SIZE))
    os.chown(path, *hostile)
    assert set(reported(collector)) == {good_rank.pid} and collector.refused() == {}  # maybe being created
    monkeypatch.setattr(rank_claims, "NOT_READY_LIMIT_NS", 0)
    assert set(reported(collector)) == {good_rank.pid}
    assert collector.refused() == {rank_claims.UNREADABLE: 1}


def fds_into(folder: pathlib.Path) -> list[str]:
    """What this process's open descriptors point at inside `folder`, sorted (other tests'
    threads in this process open and close descriptors of their own meanwhile)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed since the listing
            continue
        if target.startswith(f"{folder}/"):
            targets.append(target)
    return sorted(targets)


def test_two_thousand_sparse_segments_cost_bounded_work(collector, shm_dir, good_rank, valid_bytes, hostile):
    reported(collector)
    baseline_fds = fds_into(shm_dir)
    header = valid_bytes[:segment.HEADER_SIZE]
    for n in range(2000):  # sparse: a header at most, the rest a hole; half never finished, half lying
        path = shm_dir / f"tuiprof-{hostile[0]}-{n + 2}"
        with open(path, "wb") as f:
            if n % 2:
                f.write(forged(header, pid=1))
            f.truncate(segment.SEGMENT_SIZE)
        os.chown(path, *hostile)
    reported(collector)  # the first look opens the files each owner may have considered
    cpu = time.process_time()
    for _ in range(5):
        ranks = reported(collector)
    per_tick = (time.process_time() - cpu) / 5
    assert set(ranks) == {good_rank.pid}
    assert fds_into(shm_dir) == baseline_fds  # no fd kept for a file not believed
    refused = collector.refused()
    assert refused[rank_claims.OVER_CAP] == 2000 - rank_claims.MAX_FILES_PER_OWNER
    assert refused[rank_claims.HEADER_PID] == rank_claims.MAX_FILES_PER_OWNER // 2
    assert per_tick < 0.25, f"{per_tick * 1000:.0f} ms of CPU per interval with 2000 hostile files"


def test_inert_hook_notes_are_claims_too(collector, shm_dir, good_rank, hostile, processes):
    quiet = processes()
    gone = processes()
    gone.kill()
    gone.wait(timeout=10)
    plant(shm_dir, f"tuiprof-0-{quiet.pid}{segment.INERT_SUFFIX}", b"a file is in the way at the segment path\n")
    stale = plant(shm_dir, f"tuiprof-0-{gone.pid}{segment.INERT_SUFFIX}", b"shared memory full\n")
    plant(shm_dir, f"tuiprof-0-{good_rank.pid + 1}{segment.INERT_SUFFIX}", b"lies\n", hostile)
    ranks = reported(collector)
    assert set(ranks) == {good_rank.pid, quiet.pid}
    assert ranks[quiet.pid].hook.inactive_reason == "a file is in the way at the segment path"
    assert (ranks[quiet.pid].state, ranks[quiet.pid].uid) == (pb.RANK_STATE_RUNNING, 0)
    assert "inert" in ranks[quiet.pid].unavailable["step_time_seconds"]
    assert not stale.exists()  # its process is gone: the note means nothing any more
    assert collector.refused() == {rank_claims.OWNER: 1}
    assert ranks[good_rank.pid].hook.inactive_reason == "" and ranks[good_rank.pid].hook.pending == 0


# Inside `unshare --mount --fork`: a 64 KiB tmpfs on /dev/shm (filled to the last byte when
# asked), the stand-in job under `tuiprof run` (its hook stays inert), and the ranks
# collector as the agent runs it, before and after the job ends.
INERT_JOB = SMALL_SHM_SETUP + textwrap.dedent("""
    import json
    from agentd.collectors.ranks import RanksCollector
    from agentd.proto import tuiprof_agent_pb2 as pb
    job = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    while job.stdout.readline().strip() != "READY":
        pass
    collector = RanksCollector(0.1, directory="/dev/shm")  # this namespace's only, not every container's
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    ranks = [[r.pid, r.state, r.hook.inactive_reason] for r in snapshot.ranks]
    job.communicate("\\n", timeout=60)
    collector.collect()
    print(json.dumps({"pid": job.pid, "ranks": ranks, "left": sorted(os.listdir("/dev/shm"))}))
""")


@pytest.mark.parametrize("fill", [False, True], ids=["note-with-reason", "empty-note"])
def test_a_job_whose_hook_stayed_inert_is_reported_with_the_reason(standins, fill):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a small tmpfs on /dev/shm needs root and unshare(1)")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_USE_DAEMON"}
    done = subprocess.run(["unshare", "--mount", "--fork", sys.executable, "-c", INERT_JOB,
                           "fill" if fill else "room",
                           *tuiprof_run_argv(str(standins / "driver"), str(standins / "libworkload.so"))],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    ((pid, state, reason),) = run["ranks"]
    assert (pid, state) == (run["pid"], pb.RANK_STATE_RUNNING)
    if fill:  # the hook could not even write its reason: the agent works it out
        assert reason.startswith("the hook could not create its segment (")
        assert reason.endswith(" MiB): /dev/shm has 0 B free of 64 KiB")
    else:
        assert reason.startswith("shared memory full: posix_fallocate of ")
    assert run["left"] == (["filler"] if fill else [])  # the note went with its process


def test_a_process_with_several_segments_is_one_rank_the_newest(collector, shm_dir, good_rank, valid_bytes):
    """Names are random now, so one process can have several segments: its first one after it exec'd
    and started the hook again, or its owner's copies. It is one rank, its newest segment's."""
    real = reported(collector)[good_rank.pid]
    with segment.Segment(str(segment_path(good_rank.pid))) as seg:
        start_ns = seg.header().start_ns

    def copy(name_random: str, start: int, steps: int) -> None:
        data = bytearray(forged(valid_bytes, good_rank.pid, start_ns=start))
        struct.pack_into("<Q", data, STEP_COUNT_OFFSET, steps)
        plant(shm_dir, f"tuiprof-{ME}-{good_rank.pid}-{name_random}", bytes(data))

    copy("a" * segment.STEM_RANDOM_DIGITS, start_ns - 10**9, 777)  # older: left behind by an exec
    ranks = [r for r in reported_all(collector) if r.pid == good_rank.pid]
    assert [r.step_count for r in ranks] == [real.step_count]
    copy("b" * segment.STEM_RANDOM_DIGITS, start_ns + 10**9, 999)  # newer: the one that counts
    ranks = [r for r in reported_all(collector) if r.pid == good_rank.pid]
    assert [r.step_count for r in ranks] == [999]
