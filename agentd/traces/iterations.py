"""One start iteration for every rank of an ``--iterations`` capture.

libkineto counts optimizer steps since the process started (PyTorch's global
optimizer hook, installed when KINETO_USE_DAEMON is set); tuiprof's startup
hook counts the same steps into the rank's segment. Ranks of one data-parallel
job step together, so an absolute start iteration that none of them has reached
by the time it takes the config makes them all trace the same steps. Without
one (start 0) each rank starts at its own next step after its own poll: on
2 x H200 two ranks' 5-step windows came out 180 ms apart, sharing no collective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.kineto_config import WARMUP_ITERATIONS

# Beyond the poll lead: the agent's step counts are up to one snapshot old, and steps vary.
SLACK_SECONDS = 2.0


def common_start_iteration(ranks: Sequence[pb.RankStats | None], lead_seconds: float) -> tuple[int, str]:
    """The iteration to start every rank at, and "" — or 0 and why none can be chosen.

    Each rank's step count is projected ``lead_seconds`` (+ slack) ahead at its
    own median step time; the start is the furthest of those plus libkineto's
    warmup steps, so every rank is still short of its warmup when the config arrives.
    """
    if not ranks:
        return 0, "no ranks"
    projected = []
    for stats in ranks:
        if stats is None:
            return 0, "a process has no tuiprof segment (not started under `tuiprof run`): its step count is unknown"
        if not stats.HasField("step_time_seconds") or stats.step_time_seconds <= 0:
            return 0, f"rank pid {stats.pid} has no step time yet"
        projected.append(stats.step_count + math.ceil((lead_seconds + SLACK_SECONDS) / stats.step_time_seconds))
    return max(projected) + WARMUP_ITERATIONS, ""
