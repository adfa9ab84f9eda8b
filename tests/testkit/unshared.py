"""A process in a pid and a mount namespace of its own (``unshare --pid --mount``), the smallest
stand-in for a container's process: its host pid, and pid 1 where it runs.

    with unshared_sleep() as pid:   # the host's pid of ``sleep`` (pid 1 in its namespace)
        ...

Needs root and unshare(1); the caller skips without them (``unavailable_reason``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator


def unavailable_reason() -> str | None:
    """Why such a process cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "new pid and mount namespaces need root"
    if shutil.which("unshare") is None:
        return "unshare(1) (util-linux) is not installed"
    return None


@contextlib.contextmanager
def unshared_sleep() -> Iterator[int]:
    """``sleep`` as the first process of new pid and mount namespaces; its host pid. Killed on exit."""
    # --kill-child: the sleep dies with unshare (the first process of a pid namespace ignores
    # every signal from outside it but SIGKILL).
    launcher = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                                 "sleep", "60"])
    try:
        yield _exec_d_child(launcher.pid)
    finally:
        launcher.kill()
        launcher.wait(10)


def _exec_d_child(pid: int) -> int:
    """The child of ``pid`` once it runs sleep: by then unshare has armed --kill-child in it (killed
    before that, unshare would leave it behind)."""
    deadline = time.monotonic() + 10
    while True:
        children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children and pathlib.Path(f"/proc/{children[0]}/comm").read_text().strip() == "sleep":
            return int(children[0])
        assert time.monotonic() < deadline, "unshare started no sleep"
        time.sleep(0.01)
