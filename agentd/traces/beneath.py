"""Opening a path below a directory the way a root agent must: never through a link, never above it.

Users own folders under the trace dir and can swap any component of a path for
a symlink between a check and an open. So nothing here checks and then opens:
the kernel resolves the whole path in one call, ``openat2`` with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``, relative to a directory fd. Kernels
older than 5.6 lack openat2 (ENOSYS); there each component is opened in turn
with ``O_NOFOLLOW`` relative to the previous one, which gives the same guarantee
for the names ``agentd.traces.paths`` lets through (no ``..``, no ``/`` inside a
component).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Sequence

# openat2(2): the same number on x86_64 and aarch64 (the generic syscall table).
_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
# False once the kernel said ENOSYS: every later open walks component by component.
_has_openat2 = _OPENAT2 is not None


def open_beneath(dir_fd: int, parts: Sequence[str], flags: int, mode: int = 0o600) -> int:
    """An fd for ``dir_fd/parts[0]/…/parts[-1]`` opened with ``flags``; OSError (ELOOP, EXDEV,
    ENOENT, …) when a component is a symlink, leaves the directory, or is missing."""
    global _has_openat2
    if _has_openat2:
        try:
            return openat2(dir_fd, parts, flags, mode)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _has_openat2 = False
    return open_walking(dir_fd, parts, flags, mode)


def openat2(dir_fd: int, parts: Sequence[str], flags: int, mode: int = 0o600) -> int:
    """The kernel resolves the whole path: beneath ``dir_fd``, no symlinks at all."""
    if _OPENAT2 is None:
        raise OSError(errno.ENOSYS, f"no openat2 syscall number known for {platform.machine()}")
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _libc.syscall(_OPENAT2, dir_fd, os.fsencode("/".join(parts)), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(fd)


def open_walking(dir_fd: int, parts: Sequence[str], flags: int, mode: int = 0o600) -> int:
    """One ``O_NOFOLLOW`` open per component, each relative to the directory before it."""
    current = os.dup(dir_fd)
    try:
        for name in parts[:-1]:
            following = os.open(name, _DIRECTORY_FLAGS, dir_fd=current)
            os.close(current)
            current = following
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current)
    finally:
        os.close(current)
