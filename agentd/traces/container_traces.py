"""Kineto traces written inside a container, copied to where a host trainer's trace would be.

A trainer in another mount namespace than the agent's (a container) does not see
the agent's trace dir. Its config names a file in its own ``/tmp`` (where every
Kineto version writes on-demand traces), and once Kineto has renamed the finished
file into place the agent copies it to the path a host trainer would have written,
``<trace dir>/<uid>/<name>``: FetchFile, the summaries and the owner checks then
treat both alike, and the trace outlives the container.

Read safely: through a handle on ``/proc/<pid>`` (a pid reused since fails there, and
one reused before is told by its start time), that process's ``root``, then every
component beneath it without following any link (``beneath.open_beneath``); the file
must be a regular file owned by the trainer's uid and at most ``MAX_FILE_BYTES``, and
exactly the size it had when opened is copied. Written safely by
``TraceDir.copy_in``. The container's own file is left where it is.

One thread checks the expected files every ``CHECK_SECONDS`` while any are expected,
and exits when none are; at most ``MAX_EXPECTED`` at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pathlib
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from agentd.kineto.namespaces import ContainerTraceError
from agentd.kineto.registry import Registrant
from agentd.procfs import read_stat
from agentd.traces.beneath import open_beneath
from agentd.traces.paths import MAX_FILE_BYTES, TraceDir, reason, relative_parts

log = logging.getLogger(__name__)

CHECK_SECONDS = 1.0
MAX_EXPECTED = 1024
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY  # O_NONBLOCK: a FIFO planted there must not hang the open


@dataclass
class ContainerTrace:
    """One trace file expected inside a trainer's file system, and its copy's place in the trace dir."""

    pid: int  # the trainer, in the agent's pid namespace
    started_by_ns: int  # it started no later than this (its last poll): a later process under its pid is not it
    uid: int
    inside: tuple[str, ...]  # the file's components below the trainer's root
    destination: tuple[str, ...]  # relative to the trace dir
    deadline: float  # time.time() after which it is given up
    failure: str = ""  # why it was given up


class ContainerTraces:
    """The files expected inside containers; ``expect`` one, the thread copies it once written."""

    def __init__(self, trace_dir: TraceDir) -> None:
        self.trace_dir = trace_dir
        self._lock = threading.Lock()
        self._expected: list[ContainerTrace] = []
        self._thread: threading.Thread | None = None

    def expect(self, registrant: Registrant, inside: str, destination: str, deadline: float) -> ContainerTrace:
        """Copy the file ``inside`` (absolute, in the registrant's file system) to ``destination`` (absolute,
        in the trace dir) once Kineto has written it, until ``deadline``; ContainerTraceError when it cannot be."""
        try:
            parts = relative_parts(str(pathlib.PurePosixPath(destination).relative_to(self.trace_dir.path)),
                                   "trace file")
            inside_parts = relative_parts(inside.lstrip("/"), "file in the container")
        except ValueError as exc:  # TracePathError, or a destination outside the trace dir
            raise ContainerTraceError(f"cannot copy the trace out of the container: {exc}") from None
        last_poll_ns = time.time_ns() - int((time.monotonic() - registrant.last_seen) * 1e9)
        trace = ContainerTrace(registrant.host_pid, last_poll_ns, registrant.uid, inside_parts, parts, deadline)
        with self._lock:
            if len(self._expected) >= MAX_EXPECTED:
                raise ContainerTraceError(f"{MAX_EXPECTED} traces are being awaited inside containers already; "
                                          "try again once they are written")
            self._expected.append(trace)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="container-traces", daemon=True)
                self._thread.start()
        return trace

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_SECONDS)
            with self._lock:
                expected = list(self._expected)
            finished = [trace for trace in expected if self._advance(trace)]
            with self._lock:
                self._expected = [trace for trace in self._expected if trace not in finished]
                if not self._expected:
                    self._thread = None
                    return

    def _advance(self, trace: ContainerTrace) -> bool:
        """Copy ``trace`` if written (True: copied or given up; False: look again later)."""
        try:
            with _opened_inside(trace) as (fd, size):
                self.trace_dir.copy_in(trace.destination, trace.uid, fd, size)
        except FileNotFoundError:
            if time.time() < trace.deadline:
                return False
            trace.failure = "the trace was not written inside the container in time (see the trainer's stderr)"
        except ContainerTraceError as exc:
            trace.failure = str(exc)
        except OSError as exc:
            trace.failure = f"cannot copy the trace out of the container into the trace dir: {reason(exc)}"
        else:
            log.info("Kineto trace copied out of a container", extra={"pid": trace.pid,
                                                                     "file": "/".join(trace.destination)})
            return True
        log.warning("Kineto trace of a container not copied", extra={"pid": trace.pid, "reason": trace.failure})
        return True


@contextlib.contextmanager
def _opened_inside(trace: ContainerTrace) -> Iterator[tuple[int, int]]:
    """(fd, size) of the finished trace inside the trainer's file system; FileNotFoundError while it is not
    there yet, ContainerTraceError when it never can be (the process is gone, the file is not the trainer's)."""
    gone = ContainerTraceError("the process exited before its trace was copied out of its container")
    try:
        process = os.open(f"/proc/{trace.pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise gone from None
    try:
        now = read_stat(trace.pid)  # after the handle: a pid reused since fails at "root" below
        if now is None or not now.started_by(trace.started_by_ns):
            raise gone
        try:
            root = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=process)
        except (FileNotFoundError, ProcessLookupError):
            raise gone from None
    finally:
        os.close(process)
    try:
        try:
            fd = open_beneath(root, trace.inside, _READ)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise ContainerTraceError(f"/{'/'.join(trace.inside)} in the container passes through a symbolic "
                                          "link or a non-folder; the agent copies only plain files") from None
            raise
    finally:
        os.close(root)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != trace.uid or info.st_size > MAX_FILE_BYTES:
            raise ContainerTraceError(f"/{'/'.join(trace.inside)} in the container is not a regular file of uid "
                                      f"{trace.uid} of at most {MAX_FILE_BYTES} bytes; not copied")
        yield fd, info.st_size
    finally:
        os.close(fd)
