"""Where the host collector's readers read, and how often they read again what seldom changes.

Every reader takes a ``HostRoots``: the /proc and the /sys it reads. The agent's are the
host's own; the tests give a fixture tree (tests/agent/data/host_fixture), and another
mount namespace's /proc can be read through the same seam.
"""

from __future__ import annotations

import dataclasses
import os

# Static facts (the NUMA nodes' CPU lists, a NIC without pause counters, the RDMA ports and
# their counter files) are read again at least this often, besides when what they depend on changes.
STATIC_REFRESH_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class HostRoots:
    """The /proc and /sys directories a reader reads, as paths."""

    proc: str = "/proc"
    sys: str = "/sys"

    def in_proc(self, relative: str) -> str:
        """``relative`` (e.g. ``net/dev``) under the /proc root."""
        return os.path.join(self.proc, relative)

    def in_sys(self, relative: str) -> str:
        """``relative`` (e.g. ``class/net``) under the /sys root."""
        return os.path.join(self.sys, relative)
