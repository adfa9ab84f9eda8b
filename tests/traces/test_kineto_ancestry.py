"""A poll's claimed ancestry against /proc, and its translation into host pids (issue 28 item 2)."""

from __future__ import annotations

import os
import subprocess

import pytest

from agentd.kineto.ancestry import Ancestry, real_ancestry
from testkit.containers import Container
from testkit.namespaces import unavailable_reason


def test_the_agreeing_prefix_is_believed_as_host_pids():
    ancestry = Ancestry(seen=(7, 3, 2), host=(4107, 4103, 4102))
    assert ancestry.believed((7, 3, 2)) == (4107, 4103, 4102)
    assert ancestry.believed((7, 3)) == (4107, 4103)
    assert ancestry.believed((7, 99, 2)) == (4107,)  # a forged parent: only the process itself
    assert ancestry.believed((4107,)) == ()  # its host pid is not what it sees itself as: refused
    assert ancestry.believed((7, 3, 2, 1)) == (4107, 4103, 4102)  # nothing past the real chain


def test_outside_a_pid_namespace_seen_and_host_pids_are_the_same():
    real = real_ancestry(os.getpid())
    assert real is not None and real.seen == real.host and real.host[:2] == (os.getpid(), os.getppid())


@pytest.mark.skipif(unavailable_reason(user_name=None) is not None, reason=str(unavailable_reason(user_name=None)))
def test_a_process_in_a_container_is_seen_with_its_container_pids_and_kept_as_host_pids():
    with Container.create() as box:
        entered = box.popen(["sh", "-c", "sleep 60; true"], stdout=subprocess.DEVNULL)
        try:
            sleeper = box.host_pid_of(entered, "sleep", "60")
            shell = box.host_pid_of(entered, "sh", "sleep 60")
            real = real_ancestry(sleeper)
            inside = (box.pid_inside(sleeper), box.pid_inside(shell))
        finally:
            entered.kill()
            entered.wait(10)
    # The shell's parent is nsenter, outside the container: libkineto there sees 0 and stops.
    assert inside[0] != sleeper
    assert real == Ancestry(seen=inside, host=(sleeper, shell))
    assert real.believed(inside) == (sleeper, shell)
    assert real.believed((sleeper,)) == ()  # claiming its host pid as itself: not what it sees
