"""Files beside a rank's segment, read safely: the last uncaught exception and
Flight Recorder progress (written by the Python startup hook), and the note an
inert hook leaves instead of a segment.

They lie in a world-writable directory, and the agent may run as root: a file
is read only when it is a regular file (no symlink, no FIFO) owned by the
segment's owner, only up to a bounded size, and only when it changed. A blank
file (whitespace only) carries nothing and reads as "".
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Container

log = logging.getLogger(__name__)

READ_LIMIT = 96 * 1024  # the startup hook writes at most 64 Ki characters


class SidecarFile:
    """One file beside a segment, re-read only when it changes."""

    def __init__(self, segment_path: str, suffix: str) -> None:
        self.path = segment_path + suffix
        self._segment_path = segment_path
        self._seen: tuple[int, int] | None = None  # (mtime ns, size) of the text held
        self.text = ""

    def refresh(self, listed: Container[str]) -> str:
        """The file's text, "" while there is none. ``listed``: the side files the listing of its folder this
        interval holds (``rank_claims.Scan.side_files``); one it does not hold is not looked at (a rank without
        such files costs no ``stat``), and a file made since is read in the next interval."""
        if self.path not in listed:
            return self.text
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
            owner = os.stat(self._segment_path, follow_symlinks=False).st_uid
        except FileNotFoundError:
            return  # the segment is being cleaned up: its owner cannot be checked
        text = read_owned_text(self.path, owner, READ_LIMIT)
        if text is not None:
            self.text = text if text.strip() else ""  # a blank file says nothing: no exception, no progress

    def remove(self) -> None:
        """Delete the file with its segment (it means nothing without it)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove a rank's file beside its segment",
                        extra={"path": self.path, "reason": str(exc)})


def read_owned_text(path: str, owner_uid: int, limit: int) -> str | None:
    """Up to ``limit`` bytes of ``path`` as text, when it is a regular file owned by ``owner_uid``;
    None (and one log line why) when it is anything else: a link, a FIFO, another user's file, gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # a symlink (ELOOP), or gone between stat and open
        log.warning("rank file beside the segment not read", extra={"path": path, "reason": str(exc)})
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner_uid:
            log.warning("rank file beside the segment ignored: not a regular file of the segment's owner",
                        extra={"path": path, "uid": st.st_uid, "segment_uid": owner_uid})
            return None
        return f.read(limit).decode("utf-8", "replace")
