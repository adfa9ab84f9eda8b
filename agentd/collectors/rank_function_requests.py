"""Requests to start or stop timing Python functions in a running rank (SetFunctionTiming), written
beside its segment for the startup hook's ``tuiprof_functions`` to apply.

The request is ``<segment>.functions-request``: ``{"serial": <n>, "start": [names], "stop": [names]}``,
the serial being the agent's clock when it wrote it (ns), so a restarted agent's serials are new too.
The rank's publisher thread reads it within a second and answers in its ``.functions`` file (the serial
and one line per name it could not start or stop; ``rank_functions`` reads the answer).

The folder is every user's, and the agent may be root: the file is created under a temporary name with
``O_CREAT|O_EXCL|O_NOFOLLOW`` through the folder's descriptor (the one the ranks collector checked and
holds: a container's ``/dev/shm`` as it was opened, whatever its path has become), handed to the rank's
owner (``fchown``, when the agent is root) with mode 0600, and renamed over the request's name (a
rename replaces a name, it follows no link). The rank reads it only when it is a regular file of root or
its own user that no one else may write (``tuiprof_functions.read_request``), so another user's file
under that name is ignored, and replaced by the next request of a root agent.

The ranks collector writes the requests at its next reading (its folders' descriptors are its own and
only valid on its thread), and settles each request's futures: ``written`` once the file is there (or
with the reason it is not), ``answered`` once the rank's publication carries its serial.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import threading
import time

from agentd.proto import tuiprof_agent_pb2 as pb

REQUEST_SUFFIX = ".functions-request"  # tuiprof_native/startup/tuiprof_functions.REQUEST_SUFFIX reads it
MAX_NAMES = 64  # tuiprof_functions.MAX_FUNCTIONS: a request names at most as many to start, and to stop
MAX_NAME = 200  # tuiprof_functions.MAX_NAME
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RequestNotWrittenError(Exception):
    """The request could not be handed to the rank; the message says why."""


@dataclasses.dataclass(eq=False)
class FunctionRequest:
    """One SetFunctionTiming call on its way to a rank."""

    pid: int  # host pid
    start: list[str]
    stop: list[str]
    serial: int = dataclasses.field(default_factory=time.time_ns)
    written: concurrent.futures.Future[None] = dataclasses.field(default_factory=concurrent.futures.Future)
    answered: concurrent.futures.Future[pb.FunctionTimingOutcome] = dataclasses.field(
        default_factory=concurrent.futures.Future)

    def text(self) -> str:
        return json.dumps({"serial": self.serial, "start": self.start, "stop": self.stop})


class RequestQueue:
    """Requests submitted from the gRPC service's threads, taken by the ranks collector's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[FunctionRequest] = []

    def submit(self, request: FunctionRequest) -> None:
        with self._lock:
            self._pending.append(request)

    def take(self) -> list[FunctionRequest]:
        with self._lock:
            taken, self._pending = self._pending, []
        return taken


def write_request(folder_fd: int | None, folder_path: str, segment_name: str, owner_uid: int,
                  request: FunctionRequest) -> None:
    """Put ``request`` at ``<segment_name>.functions-request`` in the folder (``folder_fd`` when the
    collector holds one, else ``folder_path`` opened without following a link); RequestNotWrittenError
    says why not."""
    name = segment_name + REQUEST_SUFFIX
    partial = f"{name}.{os.urandom(6).hex()}.tmp"
    try:
        directory = folder_fd if folder_fd is not None else os.open(folder_path, _DIRECTORY)
    except OSError as exc:
        raise RequestNotWrittenError(f"cannot open {folder_path}: {exc.strerror}") from None
    try:
        fd = os.open(partial, _NEW_FILE, 0o600, dir_fd=directory)
        try:
            if os.geteuid() == 0 and owner_uid != 0:
                os.fchown(fd, owner_uid, -1)  # the rank believes its own user's file (and root's)
            os.write(fd, request.text().encode())
        finally:
            os.close(fd)
        os.rename(partial, name, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=directory)
        why = ("another user's file holds that name, and this agent is not root, so it cannot replace it"
               if exc.errno in (1, 13) else exc.strerror)  # EPERM, EACCES: the folder is sticky
        raise RequestNotWrittenError(f"cannot write {name} in {folder_path}: {why}") from None
    finally:
        if folder_fd is None:
            os.close(directory)


def remove_request(segment_path: str) -> None:
    """Delete the rank's request file with its segment (it means nothing without it), as the other files
    beside it are (``SidecarFile.remove``)."""
    with contextlib.suppress(OSError):  # none there, or gone already
        os.unlink(segment_path + REQUEST_SUFFIX)
