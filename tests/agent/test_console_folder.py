"""A user's console Kineto folder (agentd.kineto.console_folder), under a runtime dir the test makes.

The /tmp place, another user's folder there and two consoles of one user are played for real, as a
second user in private namespaces: tests/hostile/test_console_kineto.py.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator

import pytest

from agentd.kineto.console_folder import (
    DYNOLOG,
    ConsoleFolderError,
    NoConsoleError,
    places,
    prepare_console_folder,
    served_console_folder,
    serves,
)

UID = os.getuid()
OTHER_UID = 4242  # a uid nobody here runs as


@pytest.fixture
def runtime() -> Iterator[pathlib.Path]:
    """A runtime dir of this user's, as systemd-logind makes one (0700), with a path as short as
    /run/user/<uid> (pytest's tmp_path is too long for libkineto's socket names below it)."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tprt", dir="/tmp"))
    yield folder
    shutil.rmtree(folder)


def bound(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    return sock


def test_the_runtime_dir_comes_first_then_tmp():
    assert [p.folder for p in places(1000, {"XDG_RUNTIME_DIR": "/run/user/1000/"})] == [
        pathlib.Path("/run/user/1000/tuiprof/kineto"), pathlib.Path("/tmp/tuiprof-1000/kineto")]
    # Without XDG_RUNTIME_DIR (su -, cron) the console and the job still agree: logind's path.
    assert places(1000, {}) == places(1000, {"XDG_RUNTIME_DIR": "relative/is/ignored"}) == places(
        1000, {"XDG_RUNTIME_DIR": "/run/user/1000"})


def test_the_folder_is_made_the_users_alone(runtime):
    folder = prepare_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})
    assert folder == runtime / "tuiprof" / "kineto"
    for made in (runtime / "tuiprof", folder):
        info = made.lstat()
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == UID and stat.S_IMODE(info.st_mode) == 0o700
    assert prepare_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)}) == folder  # again: the same


def test_a_live_socket_is_a_console_and_a_stale_one_is_not(runtime):
    folder = prepare_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})
    path = folder / DYNOLOG
    assert not serves(path)  # no file
    with pytest.raises(NoConsoleError, match=f"no {path}"):
        served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})
    sock = bound(path)
    assert serves(path)
    assert served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)}) == folder
    sock.close()  # the file stays, as after a console killed with SIGKILL
    assert path.exists() and not serves(path)
    with pytest.raises(NoConsoleError, match=f"nothing holds {path}"):
        served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another uid")
def test_a_folder_of_another_user_is_never_used(runtime):
    mine = runtime / "tuiprof"
    mine.mkdir(mode=0o700)
    theirs = mine / "kineto"
    theirs.mkdir(mode=0o700)
    live = bound(theirs / DYNOLOG)
    os.chown(theirs / DYNOLOG, OTHER_UID, OTHER_UID)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    try:
        # Unsafe outranks "no console": the job is told what is wrong with the folder.
        with pytest.raises(ConsoleFolderError, match=f"{theirs} belongs to uid {OTHER_UID}, not to") as refused:
            served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})
        assert not isinstance(refused.value, NoConsoleError)
    finally:
        live.close()


def test_links_and_open_modes_are_refused(runtime):
    elsewhere = runtime / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (runtime / "tuiprof").symlink_to(elsewhere)
    with pytest.raises(ConsoleFolderError, match=f"{runtime / 'tuiprof'} is a link, not a folder"):
        served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})
    (runtime / "tuiprof").unlink()
    (runtime / "tuiprof").mkdir(mode=0o700)
    (runtime / "tuiprof").chmod(0o755)
    with pytest.raises(ConsoleFolderError, match=r"is mode drwxr-xr-x, not 0700 \(`chmod 700 "):
        served_console_folder(UID, {"XDG_RUNTIME_DIR": str(runtime)})


def test_a_runtime_dir_too_long_for_libkinetos_socket_names_is_refused(runtime):
    deep = runtime / ("d" * 60)
    deep.mkdir(mode=0o700)
    with pytest.raises(ConsoleFolderError, match="too long for libkineto's client socket names"):
        served_console_folder(UID, {"XDG_RUNTIME_DIR": str(deep)})
