"""Taking the stacks of this host's ranks and pre-merging them into one tree.

Only processes the ranks collector knows (they registered a tuiprof segment)
are ever dumped: the agent does not ptrace arbitrary processes. Dumps run in
parallel, each bounded in time (see ``agentd.hang.pyspy``).
"""

from __future__ import annotations

import os
import pathlib
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from agentd.hang import pyspy
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks.merge import merge
from agentd.stacks.wire import samples_from_ranks, tree_to_proto

# Dumps are CPU-bound (native ones symbolize libtorch): more at once than CPUs only adds contention.
MAX_PARALLEL_DUMPS = min(8, os.cpu_count() or 1)


class StackTaker:
    def __init__(self, binary: pathlib.Path, hostname: str | None = None) -> None:
        self.binary = binary
        self.hostname = hostname or socket.gethostname()

    def take(self, targets: Sequence[pb.RankStats], native: bool) -> pb.StacksReply:
        """Every target's threads, and the ranks' stacks merged into one prefix tree."""
        reply = pb.StacksReply(hostname=self.hostname, taken_unix_ns=time.time_ns())
        if targets:
            with ThreadPoolExecutor(min(MAX_PARALLEL_DUMPS, len(targets)), "stack-dump") as pool:
                dumps = pool.map(
                    lambda r: pyspy.dump(self.binary, r.pid, r.rank if r.HasField("rank") else None, native),
                    targets,
                )
                reply.ranks.extend(dumps)
        for rank in reply.ranks:
            if not rank.HasField("rank") and not rank.error:
                rank.error = "the process has no rank number: listed, but not in the merged tree"
        reply.merged.CopyFrom(tree_to_proto(merge(samples_from_ranks(reply.ranks))))
        return reply
