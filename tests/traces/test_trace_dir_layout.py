"""The trace dir's folders (owners, modes), opens that never follow a link, whole-or-nothing writes
(a real full disk: a small tmpfs), and who may fetch what. Real files, real kernel calls."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from agentd.auth import Caller
from agentd.traces import beneath
from agentd.traces.paths import TraceAccessError, TraceDir, TraceDirError, TracePathError, owner_uid, relative_parts
from agentd.traces.service import check_may_fetch

OPENERS = {"openat2": beneath.openat2, "walking": beneath.open_walking}
OTHER_UID = 4242


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """root/a/b/file, root/link-dir -> outside/, root/a/link-file -> outside/secret."""
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "root" / "a" / "b" / "file").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("outside")
    (tmp_path / "root" / "link-dir").symlink_to(tmp_path / "outside")
    (tmp_path / "root" / "a" / "link-file").symlink_to(tmp_path / "outside" / "secret")
    return tmp_path / "root"


@contextlib.contextmanager
def opened(path: pathlib.Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("opener", OPENERS.values(), ids=OPENERS.keys())
def test_opens_plain_paths_and_refuses_links_anywhere_on_the_way(tree, opener):
    with opened(tree) as root:
        fd = opener(root, ("a", "b", "file"), os.O_RDONLY)
        try:
            assert os.read(fd, 100) == b"inside"
        finally:
            os.close(fd)
        for parts in (("link-dir", "secret"), ("a", "link-file")):
            with pytest.raises(OSError) as refused:
                opener(root, parts, os.O_RDONLY)
            assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR), parts  # ENOTDIR: a link opened as a folder
        with pytest.raises(FileNotFoundError):
            opener(root, ("a", "missing"), os.O_RDONLY)


def test_openat2_is_what_this_kernel_uses():
    """On this machine's kernel (>= 5.6) the one-call path is taken, not the fallback."""
    assert beneath._has_openat2, "openat2 reported ENOSYS: the per-component fallback serves every open"


def test_plain_names_only_in_client_paths():
    assert relative_parts("1000/a-b_c.1.json", "file") == ("1000", "a-b_c.1.json")
    for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a/./b", "a\nb", "a b", "é", "x" * 65,
                "/".join(["d"] * 9), "a/" * 300]:
        with pytest.raises(TracePathError):
            relative_parts(bad, "file")
    assert owner_uid(("1000", "f.json")) == 1000
    assert owner_uid(("timeline", "1000", "f.json")) == 1000
    assert owner_uid(("0100", "f.json")) is None  # not how the agent names a uid folder
    assert owner_uid(("1000",)) is None and owner_uid(("done.json",)) is None


def test_a_local_user_fetches_only_from_their_own_folders():
    user = Caller.local(1000)
    check_may_fetch(user, ("1000", "x.json"))
    check_may_fetch(user, ("timeline", "1000", "x.json"))
    for parts in [("1001", "x.json"), ("timeline", "1001", "x.json"), ("done.json",), ("dyno", "x.json")]:
        with pytest.raises(TraceAccessError, match="you \\(uid 1000\\) may fetch only files under 1000/"):
            check_may_fetch(user, parts)
        with pytest.raises(TraceAccessError, match="may fetch none"):
            check_may_fetch(Caller.unidentified("the lookup failed"), parts)
    for admin in (Caller.token_holder(), Caller.local(0)):
        check_may_fetch(admin, ("1001", "x.json"))
        check_may_fetch(admin, ("done.json",))


@pytest.fixture
def trace_dir(tmp_path: pathlib.Path) -> TraceDir:
    if os.geteuid() != 0:
        pytest.skip("the folder owners and modes are those of an agent running as root")
    path = tmp_path / "traces"
    path.mkdir(mode=0o750)
    return TraceDir(path)


def test_folders_have_the_owners_and_modes_of_the_layout(trace_dir):
    trace_dir.prepare()
    user = trace_dir.path / trace_dir.user_folder(OTHER_UID)
    trace_dir.agent_folder(("timeline", str(OTHER_UID)))
    modes = {path.relative_to(trace_dir.path).as_posix() or ".": (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode))
             for path in [trace_dir.path, user, trace_dir.path / "timeline", trace_dir.path / "timeline" / "4242"]}
    assert modes == {".": (0, 0o711), "4242": (OTHER_UID, 0o700), "timeline": (0, 0o700),
                     "timeline/4242": (0, 0o700)}
    # A folder left with other owners or modes (an older agent's) is put right, not trusted.
    user.chmod(0o777)
    os.chown(user, 0, 0)
    trace_dir.user_folder(OTHER_UID)
    assert (user.stat().st_uid, stat.S_IMODE(user.stat().st_mode)) == (OTHER_UID, 0o700)


def test_a_trace_dir_of_another_user_is_refused(trace_dir):
    os.chown(trace_dir.path, OTHER_UID, -1)
    with pytest.raises(TraceDirError, match="belongs to uid 4242, not to the agent"):
        trace_dir.prepare()


def test_served_files_are_regular_and_owned_as_their_folder_says(trace_dir):
    user = trace_dir.path / trace_dir.user_folder(OTHER_UID)
    (user / "mine.json").write_text("{}")
    os.chown(user / "mine.json", OTHER_UID, -1)
    fd, size = trace_dir.open_file(("4242", "mine.json"))
    os.close(fd)
    assert size == 2
    (user / "roots.json").write_text("root's")  # e.g. a hard link to a root file, where the kernel allows one
    with pytest.raises(TracePathError, match="belongs to uid 0, not to uid 4242"):
        trace_dir.open_file(("4242", "roots.json"))
    os.mkfifo(user / "fifo.json")
    os.chown(user / "fifo.json", OTHER_UID, -1)
    with pytest.raises(TracePathError, match="not a regular file"):  # and the open did not wait for a writer
        trace_dir.open_file(("4242", "fifo.json"))
    (user / "x.json.tmp").write_text("{")
    with pytest.raises(TracePathError, match="unfinished"):
        trace_dir.open_file(("4242", "x.json.tmp"))


def test_writes_go_only_into_the_agents_own_folder_never_through_a_link(trace_dir, tmp_path):
    trace_dir.agent_folder(("timeline", "7"))
    trace_dir.write_file(("timeline", "7"), "t.json", b"{}")
    written = trace_dir.path / "timeline" / "7" / "t.json"
    assert written.read_bytes() == b"{}" and stat.S_IMODE(written.stat().st_mode) == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (trace_dir.path / "timeline" / "8").symlink_to(elsewhere)
    with pytest.raises(OSError) as refused:
        trace_dir.write_file(("timeline", "8"), "t.json", b"{}")
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR) and list(elsewhere.iterdir()) == []


@pytest.fixture
def full_disk() -> Iterator[TraceDir]:
    """A trace dir on a 64 KiB tmpfs: writes past that fail with ENOSPC, as on a full disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = pathlib.Path(tempfile.mkdtemp(prefix="tpfull", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield TraceDir(mount_point)
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, timeout=30)
        mount_point.rmdir()


def test_a_full_disk_leaves_no_temporary_file_and_says_why(full_disk):
    full_disk.agent_folder(("timeline", "0"))
    folder = full_disk.path / "timeline" / "0"
    with pytest.raises(OSError) as failed:
        full_disk.write_file(("timeline", "0"), "big.json", b"x" * (1 << 20))
    assert failed.value.errno == errno.ENOSPC and failed.value.strerror == "No space left on device"
    assert list(folder.iterdir()) == []
    full_disk.write_file(("timeline", "0"), "small.json", b"{}")  # room again once the temporary is gone
    assert [p.name for p in folder.iterdir()] == ["small.json"]


def test_a_folder_swapped_for_a_link_mid_walk_never_leads_outside(tree):
    """The fallback walk under a swap race: each component is opened once, without following, so the
    file read is the inside one or the open fails; never the outside one."""
    inside_b = tree / "a" / "b"
    parked = tree / "a" / "parked"
    stop = threading.Event()

    def swap() -> None:
        # Each state is held a moment (the wait hands the GIL over): without it, on a loaded machine
        # the walks could land in the same window every time (CI once saw 6,000 ENOENT and no read).
        while not stop.is_set():
            inside_b.rename(parked)
            inside_b.symlink_to(tree.parent / "outside")
            stop.wait(0.0001)
            inside_b.unlink()
            parked.rename(inside_b)
            stop.wait(0.0001)

    (tree.parent / "outside" / "file").write_text("outside")
    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[str, int] = {}

    def both_outcomes_seen() -> bool:
        return "inside" in seen and len(seen.keys() - {"inside"}) > 0

    try:
        with opened(tree) as root:
            deadline = time.monotonic() + 30
            attempts = 0
            while attempts < 3000 or (not both_outcomes_seen() and time.monotonic() < deadline):
                attempts += 1
                for opener in OPENERS.values():
                    try:
                        fd = opener(root, ("a", "b", "file"), os.O_RDONLY)
                    except OSError as exc:
                        seen[errno.errorcode[exc.errno or 0]] = seen.get(errno.errorcode[exc.errno or 0], 0) + 1
                        continue
                    with os.fdopen(fd) as f:
                        content = f.read()
                    seen[content] = seen.get(content, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert "outside" not in seen
    assert both_outcomes_seen(), seen
