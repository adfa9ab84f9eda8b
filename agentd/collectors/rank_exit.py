"""How a rank ended, from what its process left behind (the agent is not its parent).

The hook library notes in the segment header the status the process passed to
exit() and the last fatal signal it received (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
SIGABRT, SIGTERM); the Python startup hook writes the last uncaught exception's
traceback to a file beside the segment. What none of them can see — SIGKILL,
os._exit — is reported as unavailable, with the reason.

The exception file lies in a world-writable directory, and the agent may run
as root: it is read only when it is a regular file (no symlink, no FIFO) owned
by the segment's owner, and only up to a bounded size.
"""

from __future__ import annotations

import logging
import os
import stat

from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

EXCEPTION_READ_LIMIT = 96 * 1024  # the startup hook writes at most 64 Ki characters


def fill_exit_status(header, stats: pb.RankStats, flag_exited: int) -> None:
    """``exit_code`` or ``exit_signal`` of an exited rank, or both unavailable with the reason."""
    if header.exit_status is not None:
        stats.exit_code = header.exit_status
        return
    ran_exit_handlers = bool(header.flags & flag_exited)
    if header.fatal_signal is not None and not ran_exit_handlers:
        stats.exit_signal = header.fatal_signal
        return
    if ran_exit_handlers:
        why = "the process ran its exit handlers but its exit status was not recorded"
    else:
        why = ("the process neither called exit() nor received a fatal signal it could note: "
               "killed by SIGKILL (e.g. the OOM killer) or left through os._exit")
    reason = f"{why}; only its parent learns the status"
    stats.unavailable["exit_code"] = reason
    stats.unavailable["exit_signal"] = reason


class ExceptionFile:
    """The uncaught-exception file beside one segment, re-read only when it changes."""

    def __init__(self, segment_path: str, suffix: str) -> None:
        self.path = segment_path + suffix
        self._segment_path = segment_path
        self._seen: tuple[int, int] | None = None  # (mtime ns, size) of the text held
        self.text = ""

    def refresh(self) -> str:
        """The last uncaught exception with its traceback, "" when none was recorded."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return self.text
        except OSError as exc:
            log.warning("cannot stat a rank's exception file", extra={"path": self.path, "reason": str(exc)})
            return self.text
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            self._seen = seen  # judged once per version of the file, also when refused
            self._read()
        return self.text

    def _read(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:  # a symlink (ELOOP), or gone between stat and open
            log.warning("rank exception file not read", extra={"path": self.path, "reason": str(exc)})
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            try:
                owner = os.stat(self._segment_path).st_uid
            except FileNotFoundError:
                return  # the segment is being cleaned up: its owner cannot be checked
            if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
                log.warning("rank exception file ignored: not a regular file of the segment's owner",
                            extra={"path": self.path, "uid": st.st_uid, "segment_uid": owner})
                return
            self.text = f.read(EXCEPTION_READ_LIMIT).decode("utf-8", "replace")

    def remove(self) -> None:
        """Delete the file with its segment (it means nothing without it)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove a rank's exception file", extra={"path": self.path, "reason": str(exc)})
