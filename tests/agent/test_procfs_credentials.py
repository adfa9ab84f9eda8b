"""``procfs.ineligible_reason``: a process stays a rank the agent acts on only while it runs what it ran and
acts as its owner alone (issue 24 item 11; the set-user-ID case runs as a real second user in
tests/hostile/test_setuid_rank.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from agentd import procfs

# Waits for a line, then execs sleep(1): the same pid, another program.
EXEC_ON_CUE = "import os, sys; sys.stdin.readline(); os.execv(sys.argv[1], [sys.argv[1], '60'])"


def test_a_process_that_execs_another_program_is_no_longer_eligible():
    sleep = shutil.which("sleep")
    assert sleep is not None
    proc = subprocess.Popen([sys.executable, "-c", EXEC_ON_CUE, sleep], stdin=subprocess.PIPE, text=True)
    try:
        confirmed = procfs.credentials(proc.pid, os.getuid())
        assert confirmed is not None and confirmed.gid == os.getgid()
        assert procfs.ineligible_reason(proc.pid, confirmed) == ""
        assert procfs.ineligible_reason(proc.pid, procfs.Credentials(os.getuid() + 1, os.getgid(), confirmed.exe)) \
            .endswith(f"are {'/'.join([str(os.getuid())] * 4)}, not all {os.getuid() + 1} "
                      "(a set-user-ID or set-group-ID program?)")
        proc.stdin.write("exec\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/exe") != os.path.realpath(sleep):
            assert time.monotonic() < deadline, "did not exec"
            time.sleep(0.02)
        assert procfs.ineligible_reason(proc.pid, confirmed) == (
            f"process {proc.pid} runs another program than when it was confirmed as a rank (it exec'd)")
    finally:
        proc.kill()
        proc.wait(10)
    assert procfs.ineligible_reason(proc.pid, confirmed) == ""  # gone: its final reading stands


def test_a_held_status_file_follows_its_process_until_it_is_reaped():
    """``procfs.StatusFile``: state and ids by one read of the descriptor opened once; refused for a
    process that started after the claim; None once the process is reaped (a later process under the
    same pid is never read through it)."""
    claimed_before = time.time_ns()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        assert procfs.StatusFile.open(proc.pid, claimed_before - 2 * procfs.START_SLACK_NS) is None
        held = procfs.StatusFile.open(proc.pid, time.time_ns())
        assert held is not None
        status = held.read()
        assert status == procfs.ProcessStatus(procfs.SLEEPING, (os.getuid(),) * 4, (os.getgid(),) * 4)
        proc.kill()
        proc.wait(10)
        assert held.read() is None
        held.close()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_status_file_gives_state_uids_and_gids_whatever_the_name_holds():
    # The kernel prints a newline in a process's name as "\\n": no name starts a line of its own.
    raw = (b"Name:\tUid:\\nGid:\tx\nUmask:\t0022\nState:\tD (disk sleep)\nTgid:\t7\nPid:\t7\nPPid:\t1\n"
           b"TracerPid:\t0\nUid:\t1000\t0\t1000\t1000\nGid:\t100\t100\t100\t101\nFDSize:\t64\nVmRSS:\t 10 kB\n")
    assert procfs.parse_status(raw) == procfs.ProcessStatus(procfs.DISK_SLEEP, (1000, 0, 1000, 1000), (100, 100, 100, 101))
    with open("/proc/self/status", "rb") as f:
        mine = procfs.parse_status(f.read())
    assert mine.state == procfs.RUNNING and mine.uids[0] == os.getuid() and mine.gids[0] == os.getgid()
    try:
        procfs.parse_status(raw.replace(b"\nGid:", b"\nGroups:"))
    except ValueError as exc:
        assert "Gid:" in str(exc)
    else:
        raise AssertionError("a status file without Gid: parsed")
