"""Removing the segments of processes that ended, once an agent had time to report how they ended.

`tuiprof run` execs the training command, so it never sees the command end, and a process killed by
Ctrl-C (Python re-raises SIGINT to die of it) or SIGKILL runs no exit handler of the hook's: without an
agent, its 1.6 MB segment would stay in /dev/shm. So before the exec `tuiprof run` starts this watcher
(``python -m tuiprof_native.stale_segments PIDFD``, PIDFD: a pidfd of the command's process). It detaches
(its own session, no terminal, not a child of the command, which never sees it), waits on the pidfd for the
command to end, lets the job's other processes end with it (``SETTLE_SECONDS``), notes this user's segments
that no process writes any more, waits ``GRACE_SECONDS`` more, during which a running agent reports those
ranks as exited and removes their files itself (30 s after it notices an exit), and removes what is left.

Whether a segment still has a writer is asked of the kernel, not of /proc (whose pids would be another pid
namespace's for a container sharing this /dev/shm): the hook holds a shared flock(2) on its segment for as
long as its process lives (``FLAG_LOCKED`` says so), and the kernel drops it however the process ends. A
segment this watcher can lock exclusively has no writer; any other file is left alone. Another job's watcher
takes the same exclusive lock for the moment it looks, and the watchers of ranks that ended together look
together: a lock is a writer's only when it is still held after ``LOCK_TRIES`` looks a few tens of
milliseconds apart. Segments of processes that outlive the command (orphans still running) are left to the
agent, or to the next job's watcher.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import select
import stat
import sys
import time

from tuiprof_native import segment

SETTLE_SECONDS = 10.0
# The agent reports an exited rank for 30 s after it notices the exit (an interval or so after it),
# then removes its files (agentd.collectors.ranks.RanksCollector, exited_keep_seconds).
GRACE_SECONDS = 35.0
SIDECAR_SUFFIXES = (".exception", ".flight", ".functions", ".functions-request")  # beside a segment, removed with it
LOCK_TRIES = 5
LOCK_RETRY_SECONDS = 0.05  # the most a look waits before the next (drawn at random: watchers fall out of step)


def wait_for_exit(pidfd: int) -> None:
    """Until the process of ``pidfd`` has ended (a pidfd polls readable then)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while not poller.poll():
        pass


def unwritten(directory: str, uid: int) -> set[str]:
    """The names of ``uid``'s segments in ``directory`` that no live process writes."""
    names = set()
    for name in os.listdir(directory):
        parsed = segment.parse_name(name)
        if parsed is not None and parsed[0] == uid and not parsed[2] and _without_writer(directory, name, uid):
            names.add(name)
    return names


def _without_writer(directory: str, name: str, uid: int) -> bool:
    """Whether ``name`` is a segment of ``uid`` whose writer holds its lock no more."""
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return False
        if not _lock_exclusively(fd):
            return False  # its writer lives
        with segment.Segment(path) as seg:
            return (seg.device, seg.inode) == (info.st_dev, info.st_ino) and bool(seg.header().flags
                                                                                  & segment.FLAG_LOCKED)
    except (OSError, segment.SegmentError):  # gone meanwhile, not a segment of this layout, not finished
        return False
    finally:
        os.close(fd)


def _lock_exclusively(fd: int) -> bool:
    """Whether ``fd``'s file could be locked exclusively in LOCK_TRIES looks (another watcher's look holds
    it for a moment; a writer, for as long as its process lives)."""
    for look in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if look + 1 < LOCK_TRIES:
                time.sleep(random.uniform(0.0, LOCK_RETRY_SECONDS))
    return False


def remove(directory: str, name: str) -> None:
    """A segment and its side files (the sticky /dev/shm lets no one else swap a name of ours)."""
    for suffix in ("", *SIDECAR_SUFFIXES):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name + suffix))


def watch(pidfd: int, directory: str = segment.SEGMENT_DIR) -> None:
    """After the process of ``pidfd`` ends: this user's segments without a writer, removed after the grace."""
    wait_for_exit(pidfd)
    time.sleep(SETTLE_SECONDS)
    uid = os.geteuid()
    stale = unwritten(directory, uid)
    if not stale:
        return
    time.sleep(GRACE_SECONDS)
    for name in stale & unwritten(directory, uid):  # an agent may have removed some meanwhile
        remove(directory, name)


def main(argv: list[str]) -> None:
    """``PIDFD``: detach (the caller waits for this process, which ends at once), then ``watch``."""
    pidfd = int(argv[0])
    if os.fork() != 0:
        os._exit(0)
    watch(pidfd)


if __name__ == "__main__":
    main(sys.argv[1:])
