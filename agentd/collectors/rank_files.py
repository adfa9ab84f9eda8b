"""Files the Python startup hook writes beside a rank's segment (the last
uncaught exception, Flight Recorder progress), read safely.

They lie in a world-writable directory, and the agent may run as root: a file
is read only when it is a regular file (no symlink, no FIFO) owned by the
segment's owner, only up to a bounded size, and only when it changed.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

READ_LIMIT = 96 * 1024  # the startup hook writes at most 64 Ki characters


class SidecarFile:
    """One file beside a segment, re-read only when it changes."""

    def __init__(self, segment_path: str, suffix: str) -> None:
        self.path = segment_path + suffix
        self._segment_path = segment_path
        self._seen: tuple[int, int] | None = None  # (mtime ns, size) of the text held
        self.text = ""

    def refresh(self) -> str:
        """The file's text, "" while there is none."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return self.text
        except OSError as exc:
            log.warning("cannot stat a rank's file beside its segment",
                        extra={"path": self.path, "reason": str(exc)})
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
            log.warning("rank file beside the segment not read", extra={"path": self.path, "reason": str(exc)})
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            try:
                owner = os.stat(self._segment_path).st_uid
            except FileNotFoundError:
                return  # the segment is being cleaned up: its owner cannot be checked
            if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
                log.warning("rank file beside the segment ignored: not a regular file of the segment's owner",
                            extra={"path": self.path, "uid": st.st_uid, "segment_uid": owner})
                return
            self.text = f.read(READ_LIMIT).decode("utf-8", "replace")

    def remove(self) -> None:
        """Delete the file with its segment (it means nothing without it)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove a rank's file beside its segment",
                        extra={"path": self.path, "reason": str(exc)})
