"""The hook where /dev/shm is full or hostile, with real processes: the C stand-in
workload and a real PyTorch CPU training loop under `tuiprof run`.

Whatever is wrong, the job runs on unchanged: the hook stays inert, says so in one
stderr line and leaves the reason in a `.inert` note for the agent; it never
follows a link, never touches a file that is not its own, and never dies of
SIGBUS. A full /dev/shm is a 64 KiB tmpfs mounted over it in a private mount
namespace (root and unshare(1) needed); files at the names anyone could predict for the
process (``tuiprof-<uid>-<pid>``, the names before the random part) are planted by a small
launcher that then execs `tuiprof run` (the pid is kept across exec). Not by ``preexec_fn``: Python run between fork and exec in this test process,
which holds gRPC's threads from other tests, once started gRPC's poller in the child, which
then aborted when the child's descriptors were closed.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from native.support import (HOOK, SMALL_SHM_SETUP, segment_path, stand_in_rank, tuiprof_run, tuiprof_run_argv,
                            wait_for)
from tuiprof_native import segment

SEGMENT_MIB = f"{segment.SEGMENT_SIZE / 2**20:.1f}"
FULL_REASON = f"shared memory full: posix_fallocate of {SEGMENT_MIB} MiB in /dev/shm failed (No space left on device)"

TRAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        opt.step()
    print("trained", flush=True)
""")

# Runs inside `unshare --mount --fork`: a 64 KiB tmpfs on /dev/shm ("room"; "fill": filled
# to the last byte; "no-inode": every inode taken), the command with stdin closed, then what it
# left in /dev/shm.
SMALL_SHM = SMALL_SHM_SETUP + textwrap.dedent("""
    import json
    command = sys.argv[2:]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = proc.communicate(timeout=300)
    files = {name: open(os.path.join("/dev/shm", name)).read() for name in os.listdir("/dev/shm")
             if not name.startswith("filler")}
    print(json.dumps({"pid": proc.pid, "rc": proc.returncode, "stdout": out, "stderr": err, "files": files}))
""")


def inert_line(pid: int, reason: str) -> str:
    return f"tuiprof: telemetry off in pid {pid}: {reason}; training continues"


def tuiprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tuiprof:")]


def only_note(files: dict[str, str], pid: int) -> str:
    """The text of the one file left in /dev/shm: the inert note of ``pid``, under a random stem."""
    (name,) = files
    assert re.fullmatch(rf"tuiprof-{os.getuid()}-{pid}-[0-9a-f]{{16}}{re.escape(segment.INERT_SUFFIX)}", name), name
    return files[name]


@pytest.fixture(scope="module")
def mount_namespace() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs on /dev/shm needs root")
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) (util-linux) is not installed")
    probe = subprocess.run(["unshare", "--mount", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --mount is refused here: {probe.stderr.strip()}")


def run_in_small_shm(*command: str, mode: str = "room") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_USE_DAEMON"}
    done = subprocess.run(["unshare", "--mount", "--fork", sys.executable, "-c", SMALL_SHM,
                           mode, *command],
                          capture_output=True, text=True, env=env, timeout=320)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_full_shm_standin_workload_runs_on_inert(standins, mount_namespace):
    run = run_in_small_shm(*tuiprof_run_argv(str(standins / "driver"), str(standins / "libworkload.so")))
    assert run["rc"] == 0, run["stderr"]  # was 135 (SIGBUS on the first write into the segment)
    result = json.loads(run["stdout"].splitlines()[0])
    assert result["max_error"] == 0 and run["stdout"].splitlines()[1] == "READY"
    assert tuiprof_lines(run["stderr"]) == [inert_line(run["pid"], FULL_REASON)]
    assert only_note(run["files"], run["pid"]) == FULL_REASON + "\n"  # the segment and its side files went


def test_full_shm_torch_training_runs_on_inert(mount_namespace):
    run = run_in_small_shm(*tuiprof_run_argv(sys.executable, "-c", TRAIN))
    assert run["rc"] == 0, run["stderr"]
    assert run["stdout"] == "trained\n"
    assert tuiprof_lines(run["stderr"]) == [inert_line(run["pid"], FULL_REASON)]
    assert only_note(run["files"], run["pid"]) == FULL_REASON + "\n"


def test_shm_without_a_free_page_leaves_an_empty_note(standins, mount_namespace):
    run = run_in_small_shm(*tuiprof_run_argv(str(standins / "driver"), str(standins / "libworkload.so")), mode="fill")
    assert run["rc"] == 0, run["stderr"]
    assert tuiprof_lines(run["stderr"]) == [inert_line(run["pid"], FULL_REASON)]
    # the agent works the reason out itself (statvfs) from an empty note
    assert only_note(run["files"], run["pid"]) == ""


def test_shm_without_a_free_inode_says_so_on_stderr(standins, mount_namespace):
    """Every file /dev/shm can hold is taken (by anyone): no segment, no note either; the
    job's stderr says why, in one line, and the job runs on."""
    run = run_in_small_shm(*tuiprof_run_argv(str(standins / "driver"), str(standins / "libworkload.so")),
                           mode="no-inode")
    assert run["rc"] == 0, run["stderr"]
    (line,) = tuiprof_lines(run["stderr"])
    assert re.fullmatch(rf"tuiprof: telemetry off in pid {run['pid']}: shared memory has no free inode: all 64 "
                        rf"files of /dev/shm are taken, so /dev/shm/tuiprof-{os.getuid()}-{run['pid']}-[0-9a-f]{{16}} "
                        "cannot be created; training continues", line), line
    assert run["files"] == {}


PLANT_THEN_EXEC = textwrap.dedent("""
    import json, os, sys
    from tuiprof_native import segment
    own = os.path.join(segment.SEGMENT_DIR, f"tuiprof-{os.getuid()}-{os.getpid()}")
    for item in json.loads(sys.argv[1]):
        path = own + item["suffix"]
        if "link_to" in item:
            os.symlink(item["link_to"], path)
            continue
        with open(path, "w") as out:
            out.write(item["text"])
        if "owner" in item:
            os.chown(path, item["owner"], item["owner"])
            os.chmod(path, item["mode"])
    os.execv(sys.argv[2], sys.argv[2:])
""")
"""``python -c`` this, the files to plant (JSON: each a ``suffix`` after the process's predictable name
and a ``link_to`` target or a ``text``, with an ``owner`` and ``mode`` to give it), then the argv to exec."""


def link(suffix: str, target: pathlib.Path) -> dict:
    return {"suffix": suffix, "link_to": str(target)}


def planted_file(suffix: str, text: str, owner: int | None = None, mode: int = 0o644) -> dict:
    return {"suffix": suffix, "text": text} | ({"owner": owner, "mode": mode} if owner is not None else {})


def launcher(plants: list[dict]) -> tuple[str, ...]:
    return (sys.executable, "-c", PLANT_THEN_EXEC, json.dumps(plants))


def run_driver_with(standins, plants: list[dict], cleanup: list[int]) -> subprocess.CompletedProcess:
    """The stand-in workload under `tuiprof run`, with ``plants`` in place at its pid's paths first."""
    proc = tuiprof_run(str(standins / "driver"), str(standins / "libworkload.so"), launcher=launcher(plants),
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cleanup.append(proc.pid)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.pid, proc.returncode, out, err)


def file_state(path: pathlib.Path) -> tuple:
    st = path.lstat()
    return st.st_ino, st.st_uid, stat.S_IMODE(st.st_mode), st.st_mtime_ns, path.read_bytes()


def predictable(pid: int, suffix: str = "") -> pathlib.Path:
    return pathlib.Path(segment.SEGMENT_DIR) / f"tuiprof-{os.getuid()}-{pid}{suffix}"


@pytest.mark.parametrize("in_the_way", [
    "symlink",
    pytest.param("other user's file", marks=pytest.mark.skipif(os.geteuid() != 0,
                                                               reason="needs root to give a file to another uid")),
    "own stale file"])
def test_files_at_the_predictable_names_do_not_stop_the_hook(standins, cleanup_segments, tmp_path, in_the_way):
    """The squat of issue 24 item 7: whatever sits at tuiprof-<uid>-<pid>[.inert] and the side files'
    names, the hook records under its random name, and touches none of it (nor what a link points to)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"a file the job's user can write, elsewhere\n")
    before = file_state(victim)
    suffixes = ("", segment.INERT_SUFFIX, segment.EXCEPTION_SUFFIX, segment.FLIGHT_SUFFIX)
    plants = {"symlink": [link(suffix, victim) for suffix in suffixes],
              "other user's file": [planted_file(suffix, "planted by uid 65534\n", 65534, 0o666) for suffix in suffixes],
              "own stale file": [planted_file(suffix, "left by an earlier process with this pid\n")
                                 for suffix in suffixes]}[in_the_way]
    run = run_driver_with(standins, plants, cleanup_segments)
    pid = run.args
    try:
        assert run.returncode == 0, run.stderr
        assert tuiprof_lines(run.stderr) == []
        assert file_state(victim) == before
        with segment.Segment(segment_path(pid)) as seg:
            assert seg.header().pid == pid
            assert seg.header().flags & segment.FLAG_EXITED
            assert sum(s.count for s in seg.slots() if s.kind == "gemm") == 16  # the workload's finished GEMMs
        for suffix in suffixes:  # left exactly as planted
            if in_the_way == "symlink":
                assert os.readlink(predictable(pid, suffix)) == str(victim)
            else:
                assert predictable(pid, suffix).read_text() in ("planted by uid 65534\n",
                                                                "left by an earlier process with this pid\n")
    finally:
        for suffix in suffixes:
            predictable(pid, suffix).unlink(missing_ok=True)


def test_the_segments_side_files_are_taken_with_it(standins, cleanup_segments):
    """Once the segment's name is visible, so is its stem: the hook has already created the side
    files (empty, 0600, its own), so no one who lists /dev/shm can take their names."""
    with stand_in_rank(standins) as proc:
        cleanup_segments.append(proc.pid)
        path = segment_path(proc.pid)
        for suffix in (segment.EXCEPTION_SUFFIX, segment.FLIGHT_SUFFIX):
            st = path.with_name(path.name + suffix).lstat()
            assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_size == 0
        assert re.fullmatch(rf"tuiprof-{os.getuid()}-{proc.pid}-[0-9a-f]{{16}}", path.name), path.name
        assert segment.parse_name(path.name) == (os.getuid(), proc.pid, False)


# Trains 5 steps (the hook has made its files), waits for a line, then dies of an uncaught exception.
CRASH_ON_CUE = TRAIN.replace('print("trained", flush=True)', 'print("trained", flush=True)\n'
                             'import sys\nsys.stdin.readline()\nraise RuntimeError("boom after 5 steps")')


@pytest.mark.parametrize("in_the_way", ["symlink", "stale own file"])
def test_exception_sidecar_written_only_over_own_file(cleanup_segments, tmp_path, in_the_way):
    """What the startup hook finds at the exception file's name (the hook's own empty file, unless
    something replaced it since) is written over only when it is this user's regular file."""
    victim = tmp_path / "victim"
    victim.write_text("not the exception file\n")
    before = file_state(victim)
    proc = tuiprof_run(sys.executable, "-c", CRASH_ON_CUE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline() == "trained\n"
    path = segment_path(proc.pid)
    sidecar = path.with_name(path.name + segment.EXCEPTION_SUFFIX)
    sidecar.unlink()  # the hook's own empty file, replaced by what is in the way
    if in_the_way == "symlink":
        sidecar.symlink_to(victim)
    else:
        sidecar.write_text("an earlier process's exception\n")
    _, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 1 and err.rstrip().endswith("RuntimeError: boom after 5 steps")  # as without us
    with segment.Segment(str(path)) as seg:
        assert seg.header().counters.step_count == 5  # the hook itself ran
    assert file_state(victim) == before
    if in_the_way == "symlink":
        assert os.readlink(sidecar) == str(victim)
    else:
        text = sidecar.read_text()
        assert "RuntimeError: boom after 5 steps" in text and "earlier" not in text
        assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600
    assert not list(path.parent.glob(f"{path.name}*.tmp"))


IDLE = textwrap.dedent("""
    import ctypes, sys
    record_step = ctypes.CDLL(None).tuiprof_record_step
    assert record_step() == 1
    print("up", flush=True)
    for line in sys.stdin:
        record_step()
""")
IDLE_WAKEUPS_PER_S = 100  # the writer's back-off gives 20; it was ~880 with the fixed 1 ms sleep
HEARTBEAT_AGE_S = 1.0  # the agent reads once a second; the writer beats at least every 50 ms when idle


def writer_switches(pid: int) -> int:
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "tuiprof-writer":
            found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", (task / "status").read_text(), re.M)
            assert found, f"no voluntary_ctxt_switches in {task}/status"
            return int(found.group(1))
    raise AssertionError(f"pid {pid} has no tuiprof-writer thread")


def test_idle_writer_backs_off_and_still_beats(cleanup_segments):
    proc = subprocess.Popen([sys.executable, "-c", IDLE], env={**os.environ, "LD_PRELOAD": str(HOOK)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    cleanup_segments.append(proc.pid)
    try:
        assert proc.stdout.readline() == "up\n"
        with segment.Segment(segment_path(proc.pid)) as seg:
            time.sleep(0.5)  # past the first back-off steps
            start, switches = time.monotonic(), writer_switches(proc.pid)
            ages = []
            while time.monotonic() - start < 3.0:
                ages.append((time.time_ns() - seg.header().heartbeat_ns) / 1e9)
                time.sleep(0.05)
            rate = (writer_switches(proc.pid) - switches) / (time.monotonic() - start)
            assert rate < IDLE_WAKEUPS_PER_S, f"writer woke {rate:.0f} times a second while idle"
            assert max(ages) < HEARTBEAT_AGE_S, f"heartbeat ages {sorted(ages)[-5:]}"
            proc.stdin.write("step\n")  # new work after the long sleep still arrives
            proc.stdin.flush()
            assert wait_for(lambda: seg.header().counters.step_count == 2)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
