"""A user's console Kineto folder: where a non-root console's embedded agent serves libkineto, and where
`tuiprof run` points that user's jobs when no root agent offers them a folder (issue 25 item 6).

One path per user, so that a job finds a console started before it, and a console started after it
(libkineto sends every poll to ``<folder>/dynolog`` by path): ``<runtime dir>/tuiprof/kineto`` when the
user's runtime dir (``$XDG_RUNTIME_DIR``, else systemd-logind's ``/run/user/<uid>``, which is what it is
set to) is their own 0700 folder, else ``/tmp/tuiprof-<uid>/kineto``. The console serves the first it
can, a job looks in both in that order: a console and a job started from sessions with and without
XDG_RUNTIME_DIR (ssh, ``su -``, cron) still meet.

Why it is safe: every folder from the user's own one down is the user's, mode 0700, checked with lstat
(no link, no other owner, nothing for group or others) before anything is made in it or trusted, so no
other user can find or reach the sockets in it (the agent's ``dynolog``, and libkineto's client sockets
``dynoconfigclient<uuid>``, which take any datagram as the daemon's reply) nor put a socket of their own
there for a job to poll. Another user can create ``/tmp/tuiprof-<uid>`` first: then that place is refused,
the console serves a private folder of its own and the user's jobs are told what to run instead.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket
import stat
from collections.abc import Mapping

from agentd.kineto.endpoint import client_sockets_fit
from agentd.text import user_label

DYNOLOG = "dynolog"  # the agent's socket in a Kineto folder, as libkineto names it


class ConsoleFolderError(Exception):
    """A user's console Kineto folder cannot be used (the message says why)."""


class NoConsoleError(ConsoleFolderError):
    """No console of the user serves Kineto now (no folder, no socket, or a socket nobody holds)."""


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a console Kineto folder may be: ``base``, a folder of the user's (made here when ``make_base``,
    else found: XDG_RUNTIME_DIR), and ``folder`` below it."""

    base: pathlib.Path
    make_base: bool
    folder: pathlib.Path

    def chain(self) -> list[pathlib.Path]:
        """``base``, then each folder below it down to ``folder``: every one the user's alone."""
        below = self.folder.relative_to(self.base).parts
        return [self.base, *(self.base.joinpath(*below[:n]) for n in range(1, len(below) + 1))]


def places(uid: int, environ: Mapping[str, str]) -> list[Place]:
    """Where a console of ``uid`` serves Kineto, in the order tried: under the user's runtime dir
    (XDG_RUNTIME_DIR when set to an absolute path, else /run/user/<uid>), then under /tmp (never
    $TMPDIR: a job and a console must agree)."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    runtime_dir = pathlib.Path(os.path.normpath(runtime) if os.path.isabs(runtime) else f"/run/user/{uid}")
    tmp_dir = pathlib.Path(f"/tmp/tuiprof-{uid}")
    return [Place(runtime_dir, False, runtime_dir / "tuiprof" / "kineto"), Place(tmp_dir, True, tmp_dir / "kineto")]


def prepare_console_folder(uid: int, environ: Mapping[str, str]) -> pathlib.Path:
    """The first place's folder that is (or is now made) the user's own; ConsoleFolderError naming why
    each place was refused otherwise. It may hold another console's live socket: see ``serves``."""
    refused = []
    for place in places(uid, environ):
        try:
            _check_length(place)
            for folder in place.chain():
                _own_folder(folder, uid, make=folder != place.base or place.make_base)
        except ConsoleFolderError as exc:
            refused.append(str(exc))
            continue
        return place.folder
    raise ConsoleFolderError("; ".join(refused))


def served_console_folder(uid: int, environ: Mapping[str, str]) -> pathlib.Path:
    """The first place's folder, made by the user alone, whose ``dynolog`` socket (the user's) a live
    process holds: a console of theirs (no one else can bind there). NoConsoleError when no place has
    one; ConsoleFolderError when a place is not safe (a folder of another user's, a link)."""
    unsafe, missing = [], []
    for place in places(uid, environ):
        try:
            _check_length(place)
            for folder in place.chain():
                _own_folder(folder, uid, make=False)
            path = place.folder / DYNOLOG
            info = _lstat(path)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
                raise ConsoleFolderError(f"{path} is not a socket of {user_label(uid)}")
            if not serves(path):
                raise NoConsoleError(f"nothing holds {path} (a console that ended)")
        except NoConsoleError as exc:
            missing.append(str(exc))
            continue
        except ConsoleFolderError as exc:
            unsafe.append(str(exc))
            continue
        return place.folder
    if unsafe:
        raise ConsoleFolderError("; ".join(unsafe))
    raise NoConsoleError("; ".join(missing))


def serves(path: pathlib.Path) -> bool:
    """Whether a live socket is bound at ``path``: a datagram connect() succeeds on one (nothing is sent)
    and is refused on a file whose process ended; False when there is no file. ConsoleFolderError when
    it cannot be told."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError as exc:
            raise ConsoleFolderError(f"cannot tell whether a console serves {path}: {exc.strerror}") from exc
    return True


def _check_length(place: Place) -> None:
    if not client_sockets_fit(str(place.folder)):
        raise ConsoleFolderError(f"{place.folder} is too long for libkineto's client socket names in it "
                                 "(AF_UNIX paths hold 107 bytes)")


def _lstat(path: pathlib.Path) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise NoConsoleError(f"no {path}") from None
    except OSError as exc:
        raise ConsoleFolderError(f"cannot read {path}: {exc.strerror}") from exc


def _own_folder(path: pathlib.Path, uid: int, make: bool) -> None:
    """``path`` is a folder of ``uid``'s alone (made 0700 first when ``make``), not a link; else
    ConsoleFolderError. Its parent was checked already, or is a folder only its owner or root can
    rename things in (/tmp is sticky), so what is checked here stays what is used."""
    if make:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConsoleFolderError(f"cannot make {path}: {exc.strerror}") from exc
    info = _lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise ConsoleFolderError(f"{path} is a link, not a folder")
    if not stat.S_ISDIR(info.st_mode):
        raise ConsoleFolderError(f"{path} is not a folder")
    if info.st_uid != uid:
        raise ConsoleFolderError(f"{path} belongs to {user_label(info.st_uid)}, not to {user_label(uid)}")
    if info.st_mode & 0o077:
        raise ConsoleFolderError(f"{path} is mode {stat.filemode(info.st_mode)}, not 0700 "
                                 f"(`chmod 700 {path}` makes it usable)")
