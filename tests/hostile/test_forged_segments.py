"""Issue 10 end to end: the user tuiprof-hostile writes rank files into the namespace's
/dev/shm to turn the root agent against root — a copy of their own segment aimed at
root's process, the same under root's name, a FIFO, their own segment truncated while
the agent reads it. Root's process never becomes a rank (so no stacks of it, for anyone),
their own rank still does, and the agent stays healthy."""

from __future__ import annotations

import re
import sys
import time

from tuiprof_native import segment

FORGE = """
import os, struct, sys, time
source, pid, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = bytearray(open(source, "rb").read())
struct.pack_into("<i", data, 56, pid)  # tp_header.pid
struct.pack_into("<Q", data, 200, time.time_ns())  # tp_header.start_ns
fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
os.write(fd, data)
os.close(fd)
"""


def wait_for_log(agent, text: str, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while agent.log().count(text) < count:
        assert time.monotonic() < deadline, f"{count} x {text!r} not logged:\n{agent.log()}"
        time.sleep(0.1)


def segment_of(namespace, uid: int, pid: int) -> str:
    """The path of ``pid``'s segment in the namespace's /dev/shm (its name ends in the hook's random part)."""
    listed = namespace.run(["ls", "/dev/shm"])
    assert listed.returncode == 0, listed.stderr
    (name,) = [n for n in listed.stdout.split() if re.fullmatch(rf"tuiprof-{uid}-{pid}-[0-9a-f]+", n)]
    return f"{segment.SEGMENT_DIR}/{name}"


def ranks_seen(agent, rank_pid: int, user) -> set[int]:
    """The pids in a snapshot that lists ``rank_pid`` (asked as ``user``)."""
    seen = agent.client("snapshot", "--rank-pid", str(rank_pid), user=user)
    assert seen["code"] == "OK", seen
    return {r["pid"] for r in seen["reply"]["ranks"]}


def test_a_copy_aimed_at_roots_process_gets_no_stacks_of_it(agent_in_namespace, start_rank, hostile_user,
                                                           namespace, run_as_hostile):
    agent = agent_in_namespace()
    theirs = start_rank(hostile_user, "their own")
    victim = namespace.popen(["sleep", "300"])  # root's, not a rank
    try:
        source = segment_of(namespace, hostile_user.uid, theirs.pid)
        for name in (f"tuiprof-{hostile_user.uid}-{victim.pid}", f"tuiprof-0-{victim.pid}"):
            done = run_as_hostile([sys.executable, "-c", FORGE, source, str(victim.pid), f"/dev/shm/{name}"])
            assert done.returncode == 0, done.stderr
        wait_for_log(agent, "rank file refused", 2)  # the collector has judged both files
        assert victim.pid not in ranks_seen(agent, theirs.pid, None)
        for user in (hostile_user, None):  # the user, and even root: root's process is not a rank
            asked = agent.client("stacks", "--pids", str(victim.pid), user=user)
            assert asked["code"] == "PERMISSION_DENIED", asked
            assert f"pid {victim.pid} is not a live rank" in asked["details"]
        assert "why=process-uid" in agent.log() and "why=owner" in agent.log()
        agent.assert_healthy(user=hostile_user)
    finally:
        victim.kill()
        victim.wait(timeout=10)


def test_a_fifo_and_a_truncated_segment_neither_block_nor_kill_the_agent(agent_in_namespace, start_rank,
                                                                          hostile_user, run_as_hostile, namespace):
    agent = agent_in_namespace()
    roots = start_rank(None, "root's own")
    theirs = start_rank(hostile_user, "their own")
    assert roots.pid in ranks_seen(agent, theirs.pid, None)
    fifo = run_as_hostile([sys.executable, "-c", f"import os; os.mkfifo('/dev/shm/tuiprof-{hostile_user.uid}-7')"])
    assert fifo.returncode == 0, fifo.stderr
    # their own segment, cut while their rank writes it and the agent reads it (their rank may die of it)
    cut = run_as_hostile([sys.executable, "-c", "import os, sys, time\n"
                          "for i in range(400):\n"
                          "    os.truncate(sys.argv[1], 4096 if i % 2 == 0 else 1 << 20)\n"
                          "    time.sleep(0.005)\n",
                          segment_of(namespace, hostile_user.uid, theirs.pid)])
    assert cut.returncode == 0, cut.stderr
    wait_for_log(agent, "why=not-regular", 1)
    agent.assert_healthy(user=hostile_user)
    assert roots.pid in ranks_seen(agent, roots.pid, None)
    assert agent.process.poll() is None  # not 135 (SIGBUS)
