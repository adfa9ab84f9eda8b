"""The trace directory's layout, and every path under it opened without following links.

::

    <trace dir>/                     the agent's (0711 when root: users pass through, cannot list)
    <trace dir>/<uid>/               that user's (0700): their trainers' Kineto traces, written by them
    <trace dir>/timeline/<uid>/      the agent's (0700): timeline captures of that user's ranks

The agent creates each folder itself, for the uid the kernel gives for the
traced process, and writes into a user's folder only the trace that user's
trainer wrote inside its container, copied out (``TraceDir.copy_in``). Clients name files
relative to the trace dir; each component must be a plain name
(``[A-Za-z0-9._-]``, at most 64 characters), so nothing they send can hold a
newline, a ``..`` or an absolute path. Files are opened through
``agentd.traces.beneath`` (no symlink anywhere, nothing above the trace dir)
and checked after the open: a regular file, owned by whoever owns its folder,
of a bounded size. Errors name paths relative to the trace dir only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import stat
from collections.abc import Callable, Iterator, Sequence

from agentd.traces.beneath import open_beneath

# Kineto writes "<file>.tmp" and renames it when the trace is complete; so does the agent.
UNFINISHED_SUFFIX = ".tmp"
TIMELINE_FOLDER = "timeline"
NAME_CHARS = "letters, digits, '.', '_' or '-'"
MAX_NAME_CHARS = 64
MAX_PATH_CHARS = 512
MAX_DEPTH = 8
MAX_FILE_BYTES = 16 << 30
COPY_CHUNK_BYTES = 1 << 20
ROOT_MODE_AS_ROOT = 0o711
FOLDER_MODE = 0o700
FILE_MODE = 0o600
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_NAME_CHARS}}}")
_UID = re.compile(r"0|[1-9][0-9]{0,9}")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a file should be must not hang the open.
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


class TracePathError(ValueError):
    """A client-supplied name or path the agent will not use (INVALID_ARGUMENT)."""


class TraceAccessError(Exception):
    """A file that belongs to another user than the caller (PERMISSION_DENIED)."""


class TraceDirError(Exception):
    """The trace dir, or a folder of the agent's in it, cannot be used safely (FAILED_PRECONDITION);
    the message says what to do."""


def reason(exc: Exception) -> str:
    """The human part of an error: an OSError's strerror (no path in it), else its message."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def shown(text: str) -> str:
    """``text`` quoted for a one-line message: control characters escaped, long text cut."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def check_name(text: str, what: str) -> str:
    """``text`` when it is one plain name; TracePathError otherwise."""
    if not _NAME.fullmatch(text) or text in (".", ".."):
        raise TracePathError(f"{what} {shown(text)} is not a plain name: use 1-{MAX_NAME_CHARS} {NAME_CHARS}")
    return text


def relative_parts(text: str, what: str) -> tuple[str, ...]:
    """The components of ``text``, a path relative to the trace dir (TracePathError when it is not one)."""
    if not text:
        raise TracePathError(f"no {what} named: give a path relative to the trace dir, as CaptureTrace reported it")
    if len(text) > MAX_PATH_CHARS:
        raise TracePathError(f"{what} is {len(text)} characters long; paths under the trace dir have at most "
                             f"{MAX_PATH_CHARS}")
    parts = tuple(text.split("/"))
    if len(parts) > MAX_DEPTH:
        raise TracePathError(f"{what} {shown(text)} is {len(parts)} folders deep; at most {MAX_DEPTH}")
    for part in parts:
        if not _NAME.fullmatch(part) or part in (".", ".."):
            raise TracePathError(f"{what} {shown(text)} must be relative to the trace dir, made of names of "
                                 f"{NAME_CHARS} separated by '/' (no '..', no leading '/')")
    return parts


def owner_uid(parts: Sequence[str]) -> int | None:
    """The user whose files these are (``<uid>/…``, ``timeline/<uid>/…``); None: the agent's own."""
    if len(parts) > 1 and _UID.fullmatch(parts[0]):
        return int(parts[0])
    if len(parts) > 2 and parts[0] == TIMELINE_FOLDER and _UID.fullmatch(parts[1]):
        return int(parts[1])
    return None


def _file_owner(parts: Sequence[str]) -> int:
    """Who must own the file itself: the user in their own folder, the agent everywhere else."""
    if len(parts) > 1 and _UID.fullmatch(parts[0]):
        return int(parts[0])
    return os.geteuid()


class TraceDir:
    """The agent's trace directory; every file below it is reached through ``open_beneath``."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path.resolve()

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def prepare(self) -> None:
        """Check the trace dir is the agent's, and (as root) let users pass through it but not list it."""
        try:
            with self._root() as root:
                info = os.fstat(root)
                if info.st_uid != os.geteuid():
                    raise TraceDirError(f"the trace dir belongs to uid {info.st_uid}, not to the agent (uid "
                                        f"{os.geteuid()}); give the agent a trace dir of its own with --trace-dir")
                mode = stat.S_IMODE(info.st_mode)
                wanted = ROOT_MODE_AS_ROOT if os.geteuid() == 0 else mode & ~0o022
                if mode != wanted:
                    os.fchmod(root, wanted)
        except OSError as exc:
            raise TraceDirError(f"cannot use the trace dir: {exc.strerror}") from None

    def user_folder(self, uid: int) -> str:
        """``<uid>``, the folder that user's trainers write their traces into: theirs, mode 0700."""
        name = str(uid)
        with self._root() as root:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, FOLDER_MODE, dir_fd=root)
            fd = os.open(name, _DIRECTORY, dir_fd=root)
            try:
                info = os.fstat(fd)
                if info.st_uid != uid:
                    os.fchown(fd, uid, -1)
                if stat.S_IMODE(info.st_mode) != FOLDER_MODE:
                    os.fchmod(fd, FOLDER_MODE)
            finally:
                os.close(fd)
        return name

    def user_folder_path(self, uid: int) -> pathlib.Path:
        """The absolute path of ``user_folder(uid)``, after checking the trace dir (for the dynolog RPC);
        OSError when either cannot be done."""
        try:
            self.prepare()
        except TraceDirError as exc:
            raise OSError(errno.EPERM, str(exc)) from None
        return self.path / self.user_folder(uid)

    def agent_folder(self, parts: Sequence[str]) -> None:
        """Create ``parts`` (each a plain name) as the agent's own folders, mode 0700."""
        with self._root() as root:
            current = os.dup(root)
            try:
                for name in parts:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, FOLDER_MODE, dir_fd=current)
                    following = os.open(name, _DIRECTORY, dir_fd=current)
                    os.close(current)
                    current = following
                    info = os.fstat(current)
                    if info.st_uid != os.geteuid():
                        raise TraceDirError(f"{name!r} under the trace dir belongs to uid {info.st_uid}, not to "
                                            "the agent; remove it")
                    if stat.S_IMODE(info.st_mode) != FOLDER_MODE:
                        os.fchmod(current, FOLDER_MODE)
            finally:
                os.close(current)

    def open_file(self, parts: Sequence[str]) -> tuple[int, int]:
        """``(fd, size)`` of the finished regular file at ``parts``, owned as its folder says.

        FileNotFoundError when absent; TracePathError when it is a link, not a
        regular file, someone else's file in that folder, or too large.
        """
        relative = "/".join(parts)
        if relative.endswith(UNFINISHED_SUFFIX):
            raise TracePathError(f"{shown(relative)} is an unfinished trace (still being written); fetch it "
                                 "once renamed")
        with self._root() as root:
            try:
                fd = open_beneath(root, parts, _READ)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise FileNotFoundError(errno.ENOENT, f"no finished file {shown(relative)} under the trace dir") \
                        from None
                if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                    raise TracePathError(f"{shown(relative)} passes through a symbolic link or a non-folder; "
                                         "the agent serves only plain files in its trace dir") from None
                raise
        try:
            info = os.fstat(fd)
            _check_served(info, parts, relative)
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size

    def is_finished(self, relative: str) -> bool:
        """Whether ``relative`` names a finished file that ``open_file`` would serve."""
        try:
            fd, _ = self.open_file(relative_parts(relative, "file"))
        except (OSError, TracePathError):
            return False
        os.close(fd)
        return True

    def write_file(self, folder: Sequence[str], name: str, data: bytes) -> None:
        """``data`` as ``folder/name`` in the agent's own ``folder``, whole or not at all (see ``_replace``)."""
        with self._root() as root:
            folder_fd = open_beneath(root, folder, _DIRECTORY)
        try:
            _replace(folder_fd, name, lambda fd: _write_all(fd, data))
        finally:
            os.close(folder_fd)

    def copy_in(self, parts: Sequence[str], uid: int, source_fd: int, size: int) -> None:
        """The first ``size`` bytes of ``source_fd`` as ``parts`` (a file in ``uid``'s own folder, or a
        folder of theirs in it), given to ``uid``: a trace a trainer wrote inside its container.

        The one write into a user's folder: the folder is reached without following links and must be
        ``uid``'s, the file is created exclusively (never through a link) and renamed into place
        (``_replace``). OSError (PermissionError: the folder is someone else's) when it cannot be done."""
        if owner_uid(parts) != uid or len(parts) < 2 or parts[0] == TIMELINE_FOLDER:
            raise PermissionError(errno.EPERM, f"{shown('/'.join(parts))} is not in the folder of uid {uid}")
        with self._root() as root:
            folder_fd = open_beneath(root, parts[:-1], _DIRECTORY)
        try:
            folder = os.fstat(folder_fd)
            if folder.st_uid != uid:
                raise PermissionError(errno.EPERM, f"{shown('/'.join(parts[:-1]))} belongs to uid {folder.st_uid}, "
                                                   f"not to uid {uid}")

            def fill(fd: int) -> None:
                os.fchown(fd, uid, folder.st_gid)
                _copy_range(source_fd, fd, size)

            _replace(folder_fd, parts[-1], fill)
        finally:
            os.close(folder_fd)


def _replace(folder_fd: int, name: str, fill: Callable[[int], None]) -> None:
    """``name`` in ``folder_fd`` filled by ``fill(fd)``, whole or not at all.

    Written to ``name.tmp`` (created exclusively, never through a link), then
    renamed; when filling fails (a full disk) the temporary file is removed
    and the OSError raised."""
    temporary = name + UNFINISHED_SUFFIX
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary, dir_fd=folder_fd)  # left by an agent killed mid-write
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE, dir_fd=folder_fd)
    try:
        try:
            fill(fd)
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except OSError:
        os.unlink(temporary, dir_fd=folder_fd)
        raise


def _copy_range(source_fd: int, fd: int, size: int) -> None:
    """Bytes 0 to ``size`` of ``source_fd`` into ``fd``; nothing past ``size`` is read."""
    offset = 0
    while offset < size:
        chunk = os.pread(source_fd, min(COPY_CHUNK_BYTES, size - offset), offset)
        if not chunk:
            raise OSError(errno.EIO, f"the file shrank to {offset} bytes while being copied ({size} expected)")
        _write_all(fd, chunk)
        offset += len(chunk)


def _check_served(info: os.stat_result, parts: Sequence[str], relative: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise TracePathError(f"{shown(relative)} is not a regular file")
    owner = _file_owner(parts)
    if info.st_uid != owner:
        raise TracePathError(f"{shown(relative)} belongs to uid {info.st_uid}, not to uid {owner} whose folder "
                             "holds it; the agent does not serve it")
    if info.st_size > MAX_FILE_BYTES:
        raise TracePathError(f"{shown(relative)} is {info.st_size} bytes, more than the {MAX_FILE_BYTES} the "
                             "agent serves")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
