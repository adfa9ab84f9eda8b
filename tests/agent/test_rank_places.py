"""Which ``/dev/shm`` folders a root agent reads and whose processes each holds (``agentd.collectors.rank_places``),
on this machine: containers made with unshare (``testkit/containers.py``), the kernel's process events heard.

With the events, /proc is listed once; then a container started later is found by its entrypoint's exec, and a
process that exits leaves its folder's processes, with no listing. Without them (or after lost events) /proc is
listed every SCAN_SECONDS, as before the events were used.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from agentd import proc_events
from agentd.collectors import rank_places
from agentd.collectors.rank_places import SegmentFolder, SegmentFolders
from testkit.containers import Container
from testkit.namespaces import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason(user_name=None) is not None,
                                reason=str(unavailable_reason(user_name=None)))

HOST_SHM = "/dev/shm"
HEARD_NOTHING = proc_events.Changes(set(), set(), set(), False)


@pytest.fixture
def events() -> Iterator[proc_events.ProcessEvents]:
    listener = proc_events.ProcessEvents.subscribe()
    yield listener
    listener.close()


class Listings:
    """The /proc listings (``SegmentFolders._scan``) a test's folders made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        scan = SegmentFolders._scan

        def counted(folders: SegmentFolders, in_use: set[str]) -> None:
            self.count += 1
            scan(folders, in_use)
        monkeypatch.setattr(SegmentFolders, "_scan", counted)


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> Listings:
    return Listings(monkeypatch)


@pytest.fixture
def folders() -> Iterator[SegmentFolders]:
    found = SegmentFolders(HOST_SHM, containers=True)
    yield found
    found.close()


def folder_of(found: list[SegmentFolder], pid: int) -> SegmentFolder | None:
    """The folder among ``found`` that is ``/dev/shm`` of process ``pid``."""
    shm = os.stat(f"/proc/{pid}/root/dev/shm")
    for folder in found:
        info = os.stat(folder.path)
        if (info.st_dev, info.st_ino) == (shm.st_dev, shm.st_ino):
            return folder
    return None


def age(folders: SegmentFolders, seconds: float) -> None:
    """As if ``seconds`` had passed since /proc was last listed."""
    folders._scanned_at -= seconds


def settled(folders: SegmentFolders, events: proc_events.ProcessEvents,
            condition: Callable[[list[SegmentFolder]], bool]) -> list[SegmentFolder]:
    """The folders once ``condition`` holds, asked again as events arrive: an exit is told after the exiting
    process's parent could wait for it, an exec after its new program shows in /proc."""
    deadline = time.monotonic() + 10
    while not condition(found := folders.current(lambda: (), events.drain())):
        assert time.monotonic() < deadline, "the events never told"
        time.sleep(0.01)
    return found


def test_a_container_started_after_the_listing_is_found_by_its_entrypoints_exec(events, folders, listings):
    folders.current(lambda: (), events.drain())
    assert listings.count == 1  # the first call lists /proc
    with Container.create(docker_cgroup=False) as box:
        found = settled(folders, events, lambda found: folder_of(found, box.init_pid) is not None)
        folder = folder_of(found, box.init_pid)
        assert folder is not None and not folder.own  # its own tmpfs, opened through its process
        assert folder.candidates(1) == [box.init_pid]  # its pid 1 is the container's, not the host's init
        assert box.init_pid not in folders.own.foreign
        assert listings.count == 1


def test_a_process_that_exits_leaves_its_folder_at_the_next_call(events, folders, listings):
    with Container.create(docker_cgroup=False) as box:
        folders.current(lambda: (), events.drain())
        entered = box.popen(["sleep", "300"])  # as `docker exec` enters a container: heard by its exec
        host = subprocess.Popen(["sleep", "300"])
        try:
            sleeper = box.host_pid_of(entered, "sleep", "300")
            inside = Container.pid_inside(sleeper)
            folder = folder_of(folders.current(lambda: (), events.drain()), box.init_pid)
            assert folder is not None
            settled(folders, events, lambda _: folder.candidates(inside) == [sleeper] and host.pid in folders.own.members)
            os.kill(sleeper, 9)
            entered.wait(10)  # nsenter reaps it, then exits
            host.kill()
            host.wait(10)
            # Its pid, reused, would place nothing.
            settled(folders, events, lambda _: folder.candidates(inside) == [] and host.pid not in folders.own.members)
            assert listings.count == 1
        finally:
            for process in (entered, host):
                process.kill()
                process.wait(10)


def test_a_tmpfs_mounted_on_dev_shm_after_the_first_exec_is_found_at_the_next(events, folders, listings):
    """``unshare --mount`` execs its command in the new namespace while its /dev/shm is still the host's;
    the private tmpfs mounted then is found when the command execs the program that will use it."""
    steps = "echo ready; read cue; mount -t tmpfs -o size=1m tmpfs /dev/shm; exec sleep 300"
    with subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", steps],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        try:
            folders.current(lambda: (), events.drain())
            assert process.stdin is not None and process.stdout is not None
            assert process.stdout.readline() == "ready\n"  # sh's exec was told before it wrote
            folders.current(lambda: (), events.drain())
            assert process.pid in folders.own.members  # its /dev/shm is the host's still
            process.stdin.write("go\n")
            process.stdin.flush()
            found = settled(folders, events, lambda found: not _is_own(folder_of(found, process.pid)))
            folder = folder_of(found, process.pid)
            assert folder is not None and process.pid in folder.members
            assert process.pid not in folders.own.members
            assert listings.count == 1
        finally:
            process.kill()


def _is_own(folder: SegmentFolder | None) -> bool:
    return folder is not None and folder.own


def test_without_events_proc_is_listed_every_scan_seconds(folders, listings):
    folders.current(lambda: (), None)
    with Container.create(docker_cgroup=False) as box:
        found = folders.current(lambda: (), None)
        assert listings.count == 1 and folder_of(found, box.init_pid) is None  # not listed yet
        age(folders, rank_places.SCAN_SECONDS)
        found = folders.current(lambda: (), None)
        assert listings.count == 2
        folder = folder_of(found, box.init_pid)
        assert folder is not None and not folder.own and folder.candidates(1) == [box.init_pid]


def test_events_list_proc_every_full_scan_seconds(folders, listings):
    folders.current(lambda: (), HEARD_NOTHING)
    age(folders, rank_places.SCAN_SECONDS)
    folders.current(lambda: (), HEARD_NOTHING)
    assert listings.count == 1
    age(folders, rank_places.FULL_SCAN_SECONDS)
    folders.current(lambda: (), HEARD_NOTHING)
    assert listings.count == 2


def test_lost_events_list_proc(folders, listings):
    folders.current(lambda: (), HEARD_NOTHING)
    folders.current(lambda: (), proc_events.Changes(set(), set(), set(), lost=True))
    assert listings.count == 2
    folders.current(lambda: (), HEARD_NOTHING)
    assert listings.count == 2


def test_events_after_a_call_without_them_list_proc_first(folders, listings):
    """What happened while no events were passed was not heard: the listing must see it."""
    folders.current(lambda: (), HEARD_NOTHING)
    folders.current(lambda: (), None)
    assert listings.count == 1
    folders.current(lambda: (), HEARD_NOTHING)
    assert listings.count == 2


def test_a_name_no_process_holds_asks_for_a_listing(events, folders, listings):
    folders.current(lambda: (), events.drain())
    folders.claimant(folders.own, 2**22 + 1, 0, (0, 0))  # above any pid_max: in its own folder, an exited rank
    folders.current(lambda: (), events.drain())
    assert listings.count == 2


def test_a_dead_containers_folder_is_closed_by_the_next_listing_unless_in_use(events, folders, listings):
    with Container.create(docker_cgroup=False) as box:
        folders.current(lambda: (), events.drain())
        with Container.create(docker_cgroup=False) as kept_box, Container.create(docker_cgroup=False) as closed_box:
            found = settled(folders, events, lambda found: None not in (folder_of(found, kept_box.init_pid),
                                                                         folder_of(found, closed_box.init_pid)))
            kept, closed = folder_of(found, kept_box.init_pid), folder_of(found, closed_box.init_pid)
            assert kept is not None and closed is not None
        # Gone from it, still open: no event tells that a namespace lost its last process.
        found = settled(folders, events, lambda _: closed.candidates(1) == [])
        assert closed in found and listings.count == 1
        age(folders, rank_places.FULL_SCAN_SECONDS)
        found = folders.current(lambda: {kept.path}, events.drain())
        assert kept in found and closed not in found and closed.fd is None
        assert folder_of(found, box.init_pid) is not None
