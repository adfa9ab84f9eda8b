"""The hosts' answers to one stacks request, and which job their live ranks belong to.

Filled by ``tuiprof.client.stacks`` (the network side), read by the stacks
command, the stacks screen and ``tuiprof.analysis.stacks_report``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.errors import BadInputError


@dataclass
class HostStacks:
    """One agent's answer: its ranks' stacks and its latest snapshot, or why not."""

    host: str
    reply: pb.StacksReply | None = None
    snapshot: pb.HostSnapshot | None = None
    error: str | None = None

    def live_ranks(self) -> list[pb.RankStats]:
        """The ranks of the host's snapshot that have not exited."""
        return [r for r in self.snapshot.ranks if r.state != pb.RANK_STATE_EXITED] if self.snapshot is not None else []


class JobChoiceError(BadInputError):
    """The hosts run several jobs and none was chosen (their rank numbers overlap)."""

    def __init__(self, jobs: dict[str, int]) -> None:
        self.jobs = jobs  # job id -> live ranks
        listed = ", ".join(f"{job or '(no job id)'} ({count} ranks)" for job, count in sorted(jobs.items()))
        super().__init__(f"these hosts run several jobs: {listed}; choose one with --job ID")


def single_job(hosts: list[HostStacks]) -> str | None:
    """The one job the hosts' live ranks belong to; several are refused (rank numbers would collide)."""
    jobs: dict[str, int] = {}
    for host in hosts:
        for rank in host.live_ranks():
            jobs[rank.job_id] = jobs.get(rank.job_id, 0) + 1
    if len(jobs) > 1:
        raise JobChoiceError(jobs)
    return next(iter(jobs), None)
