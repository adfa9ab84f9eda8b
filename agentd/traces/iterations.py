"""One start iteration for every rank of an ``--iterations`` capture.

libkineto counts optimizer steps since the process started (PyTorch's global
optimizer hook, installed when KINETO_USE_DAEMON is set); tuiprof's startup
hook counts the same steps into the rank's segment. Ranks of one data-parallel
job step together, so an absolute start iteration that none of them has reached
by the time it takes the config makes them all trace the same steps. Without
one (start 0) each rank starts at its own next step after its own poll: on
2 x H200 two ranks' 5-step windows came out 180 ms apart, sharing no collective.

The projection uses each rank's step rate over the last seconds (steps counted
between snapshots), not its median step time: a CUDA job's CPU side runs ahead
of the GPU between synchronisations, so most step-to-step times are far shorter
than the real step (on 2 x H200 that put the start 45 s ahead instead of 10).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.kineto.config import WARMUP_ITERATIONS

# Beyond the poll lead: snapshots are an interval old, and the step rate varies.
SLACK_SECONDS = 2.0
RATE_WINDOW_SECONDS = 10.0
MIN_RATE_SPAN_SECONDS = 1.0


class StepRates:
    """Each rank's step count over the last RATE_WINDOW_SECONDS, from successive snapshots."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, int]]] = {}

    def observe(self, ranks: Iterable[pb.RankStats], now: float) -> None:
        seen = set()
        for rank in ranks:
            samples = self._samples.setdefault(rank.pid, deque())
            samples.append((now, rank.step_count))
            while now - samples[0][0] > RATE_WINDOW_SECONDS:
                samples.popleft()
            seen.add(rank.pid)
        for pid in self._samples.keys() - seen:
            del self._samples[pid]

    def projected_step(self, pid: int, at: float) -> tuple[int | None, str]:
        """The step ``pid`` will have reached at monotonic time ``at``, or None and why it cannot be told."""
        samples = self._samples.get(pid)
        if not samples:
            return None, f"pid {pid} has no tuiprof segment (not started under `tuiprof run`): its step count is unknown"
        (first_time, first_count), (last_time, last_count) = samples[0], samples[-1]
        if last_time - first_time < MIN_RATE_SPAN_SECONDS or last_count <= first_count:
            return None, f"pid {pid} has not stepped for long enough to know its step rate"
        rate = (last_count - first_count) / (last_time - first_time)
        return last_count + int(rate * (at - last_time)) + 1, ""


def common_start_iteration(projected: Sequence[tuple[int | None, str]]) -> tuple[int, str]:
    """The iteration to start every rank at (the furthest projection plus libkineto's warmup
    steps, so that no rank has begun its warmup when the config arrives), and "" — or 0 and why not."""
    if not projected:
        return 0, "no ranks"
    for step, why in projected:
        if step is None:
            return 0, why
    return max(step for step, _ in projected if step is not None) + WARMUP_ITERATIONS, ""
