"""The slowdown verdict: which rank the others wait for, what it costs the job, and why.

One judge, fed every snapshot with the ranks it can see (``feeds``): the agent feeds
its own host's, the console every host's of a job. Per job (ranks grouped by job id):

Attribute. Each collective's arrivals (``RankStats.arrivals``) are joined on
(communicator, sequence number) once every rank taking part in that communicator
reported it. The last rank to start held the others up by its start minus the
runner-up's (``waits.arrivals``).

Cost. Per step of the late rank, what it held the others up in that step (``_costs``),
averaged over the last ``WINDOW_S``: had it arrived with the others, the step would be
that much shorter. Once the job has a healthy baseline (judged over its collectives), no
rank's cost is more than the step's rise over it (``_bound``): had that rank worked as
before, the job could at best be back at its baseline. The bound matters with kernel starts
and several collectives a step (DDP's buckets): after the others waited for the late rank at
one, they start the next as soon as it can begin, while the late rank starts it when its own
backward pass has produced it; that gap, which the healthy schedule has too, is charged to
the late rank; and a rank whose compute keeps a constant phase behind its peers' is late at
every collective without the step growing at all (a healthy 2-rank DDP job on 2 H200s).

Detect. A job is slow while one rank's cost is at least ``COST_MIN_FRACTION`` of the
step and ``DOMINANCE`` times the next rank's (chosen before the bound, which may level
them, and still ``COST_MIN_FRACTION`` of the step after it), or while the step time is
``STEP_RISE`` above its baseline (the step time while the job was healthy). Noise a
healthy job makes is spread over its ranks and small (bench/slowdown/README.md has
the figures these thresholds were chosen against). It must hold for
``CONFIRM_SNAPSHOTS`` snapshots in a row, and a slow job is healthy again only after
``CLEAR_SNAPSHOTS`` snapshots without it.

Cause. The costliest rank's signals against its peers' median, first match wins:
stopped (seen in state T), GC pauses, DataLoader waits, CPU run-queue delay or quota
throttling, another process on its GPU, slower GEMMs at the same shapes. Without a
culprit, a step that grew with the time spent in NCCL kernels is slow
communication. Otherwise unknown, with the figures that were checked. Signals a
rank could not give are listed as unchecked with their reason.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.slowdown.feeds import SIGNALS, GpuFeed, RankFeed, RankKey, from_snapshot
from agentd.slowdown.waits import arrivals
from agentd.stacks.verdicts import rank_or_pid

WINDOW_S = 6.0
SETTLE_S = 4.0            # a collective not reported by all its ranks by then is dropped
COST_MIN_FRACTION = 0.10
DOMINANCE = 3.0
STEP_RISE = 0.25
MIN_COLLECTIVES = 6       # joined collectives in the window before judging
CONFIRM_SNAPSHOTS = 2
CLEAR_SNAPSHOTS = 5
BASELINE_SNAPSHOTS = 60
STOPPED_MEMORY_S = 60.0   # a duty cycle of SIGSTOP is seen in some snapshots only: remember a minute of them
SIGNAL_SNAPSHOTS = 3
SIGNAL_SHARE = 0.3        # a signal explains the cost when its excess over the peers is this share of it
GEMM_SLOWER = 1.05        # the culprit's mean GEMM time at a shape its peers run, over theirs

_SIGNAL_CAUSES = (  # (signal, cause, what the rank was doing)
    ("gc_pause_seconds_per_s", pb.SLOWDOWN_CAUSE_GC_PAUSES, "paused for garbage collection"),
    ("dataloader_wait_seconds_per_s", pb.SLOWDOWN_CAUSE_INPUT_PIPELINE, "waited for its DataLoader"),
    ("run_delay_seconds_per_s", pb.SLOWDOWN_CAUSE_CPU_STARVED, "had threads waiting for a CPU (run-queue delay)"),
    ("cpu_throttled_seconds_per_s", pb.SLOWDOWN_CAUSE_CPU_STARVED, "was throttled by its cgroup's CPU quota"),
)


@dataclass
class _Rank:
    """What the judge remembers of one rank process."""

    feed: RankFeed
    steps: deque = field(default_factory=deque)     # (time, step count)
    signals: deque = field(default_factory=deque)   # (time, {signal: rate})
    gemm: dict[str, float] = field(default_factory=dict)
    stopped: deque = field(default_factory=deque)   # times it was seen stopped, the last STOPPED_MEMORY_S
    step_ends: list[int] = field(default_factory=list)  # Unix ns, in order, the last 2 × WINDOW_S of them


# One collective joined: (when joined, its sequence number, the latest start in Unix ns, the rank id of the last
# to start, how long it held the others up alone in ns)
_Joined = tuple[float, int, float, int, float]


@dataclass
class _Job:
    ranks: dict[RankKey, _Rank] = field(default_factory=dict)
    # A small number per rank for the hot loop (a (host, pid) tuple is hashed anew at every lookup).
    ids: dict[RankKey, int] = field(default_factory=dict)
    # comm → seq → rank id → start; when each was first reported
    pending: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)
    enqueued: dict[str, bool] = field(default_factory=dict)  # comm → its starts are CPU enqueue times
    first_seen: dict[tuple[str, int], float] = field(default_factory=dict)
    members: dict[str, dict[int, float]] = field(default_factory=dict)  # comm → rank id → last seen reporting
    joined: dict[str, deque[_Joined]] = field(default_factory=dict)  # comm → those of the last WINDOW_S, oldest first
    baseline: deque = field(default_factory=lambda: deque(maxlen=BASELINE_SNAPSHOTS))
    comm_baseline: deque = field(default_factory=lambda: deque(maxlen=BASELINE_SNAPSHOTS))
    slow_streak: int = 0
    clear_streak: int = 0
    since_ns: int = 0
    verdict: pb.JobSlowdown | None = None


class SlowdownJudge:
    """Turns successive feeds (one list per snapshot) into one ``JobSlowdown`` per job."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall_clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock, self._wall_ns = clock, wall_clock_ns
        self._jobs: dict[str, _Job] = {}

    def observe(self, feeds: Iterable[RankFeed]) -> list[pb.JobSlowdown]:
        """Every job's verdict after this snapshot, jobs of at least two ranks only, by job id."""
        now = self._clock()
        by_job: dict[str, list[RankFeed]] = {}
        for feed in feeds:
            if feed.state != pb.RANK_STATE_EXITED:
                by_job.setdefault(feed.job_id, []).append(feed)
        self._jobs = {job_id: self._jobs.get(job_id) or _Job() for job_id in by_job}
        verdicts = []
        for job_id, members in sorted(by_job.items()):
            if len(members) >= 2:
                verdicts.append(self._judge(job_id, self._jobs[job_id], members, now))
        return verdicts

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        """``snapshot.slowdowns`` judged over the snapshot's own ranks (the agent's post-processor)."""
        snapshot.slowdowns.extend(self.observe(from_snapshot(snapshot)))

    # ------------------------------------------------------------ one job

    def _judge(self, job_id: str, job: _Job, feeds: list[RankFeed], now: float) -> pb.JobSlowdown:
        job.ranks = {f.key: _remember(job.ranks.get(f.key), f, now) for f in feeds}
        _join(job, feeds, now)
        _expire(job, now)
        step = _job_step_seconds(job)
        baseline = statistics.median(job.baseline) if job.baseline else None
        costs = _costs(job, step)
        judged = _joined_count(job) >= MIN_COLLECTIVES
        culprits = _culprits(costs, step) if judged else []
        waited = _bound(costs, step, baseline)
        culprits = [c for c in culprits if step is not None and c.cost_seconds >= COST_MIN_FRACTION * step]
        verdict = pb.JobSlowdown(job_id=job_id, ranks=costs)
        if step is None:
            verdict.unavailable["step_seconds"] = "no rank finished two optimizer steps in the window"
        else:
            verdict.step_seconds = step
        if baseline is not None:
            verdict.baseline_step_seconds = baseline
        else:
            verdict.unavailable["baseline_step_seconds"] = "no healthy window seen yet"
        rose = step is not None and baseline is not None and step > baseline * (1 + STEP_RISE)
        slow_now = bool(culprits) or rose
        job.slow_streak = job.slow_streak + 1 if slow_now else 0
        job.clear_streak = 0 if slow_now else job.clear_streak + 1
        was_slow = job.verdict is not None and job.verdict.slow
        slow = job.slow_streak >= CONFIRM_SNAPSHOTS or (was_slow and job.clear_streak < CLEAR_SNAPSHOTS)
        if not slow:
            job.since_ns = 0
            # healthy as judged over its collectives, when its ranks report any (a step taken while a rank was
            # late but its collectives not yet joined would bound that rank's cost to nothing: ``_bound``)
            if step is not None and not slow_now and (judged or not job.joined):
                job.baseline.append(step)
                comm = _median([r.feed.comm_seconds_per_s for r in job.ranks.values()])
                if comm is not None:
                    job.comm_baseline.append(comm * step)
        else:
            if not job.since_ns:
                job.since_ns = self._wall_ns()
            _explain(verdict, job, culprits or _culprits_of_last(job), costs, waited, step, baseline)
            verdict.slow = True
            verdict.since_unix_ns = job.since_ns
        job.verdict = verdict
        return verdict


def _remember(rank: _Rank | None, feed: RankFeed, now: float) -> _Rank:
    """Take one snapshot's feed of a rank; a snapshot seen before (same ``at``) adds no sample."""
    rank = rank or _Rank(feed)
    fresh = feed.at is None or not rank.steps or rank.feed.at != feed.at
    rank.feed = feed
    if fresh:
        # Steps are timed by the host's snapshot clock where it says: a host whose snapshot came late
        # still has its steps at the time it counted them.
        rank.steps.append((now if feed.at is None else feed.at, feed.step_count))
        rank.signals.append((now, {k: v for k, v in feed.signals.items() if v is not None}))
    rank.gemm.update(feed.gemm_seconds)
    if feed.step_ends:
        rank.step_ends.extend(feed.step_ends)
        rank.step_ends.sort()
        del rank.step_ends[:bisect.bisect_left(rank.step_ends, rank.step_ends[-1] - 2 * WINDOW_S * 1e9)]
    if feed.state == pb.RANK_STATE_STOPPED:
        rank.stopped.append(now)
    while rank.stopped and now - rank.stopped[0] > STOPPED_MEMORY_S:
        rank.stopped.popleft()
    return rank


def _join(job: _Job, feeds: Sequence[RankFeed], now: float) -> None:
    """Add the feeds' arrivals; settle every collective all its communicator's ranks reported.

    The hot loop of a large job (16,000 arrivals a round at 1024 ranks, 64,000 when sampled blocks land
    together: bench/slowdown/scale.py). A communicator's ranks report the same collectives in a round
    (they draw the same blocks), so its ranks are grouped by the sequence numbers they reported and a
    collective's starts are taken from a group as one column: Python works per collective and per rank,
    builtins move the arrivals. When the group is every rank of the communicator, a collective none
    reported before is settled from its column; otherwise the column joins the pending starts."""
    # comm → the sequence numbers reported → (the ranks that reported them, each one's starts)
    reported: dict[str, dict[tuple[int, ...], tuple[list[int], list[Sequence[int]]]]] = {}
    for feed in feeds:
        rid = job.ids.setdefault(feed.key, len(job.ids))
        for comm_arrivals in feed.arrivals:
            comm = comm_arrivals.comm
            job.enqueued[comm] = comm_arrivals.enqueued
            job.members.setdefault(comm, {})[rid] = now
            rids, rows = reported.setdefault(comm, {}).setdefault(tuple(comm_arrivals.sequence), ([], []))
            rids.append(rid)
            rows.append(comm_arrivals.start_unix_ns)
    for comm, groups in reported.items():
        pending = job.pending.setdefault(comm, {})
        members = job.members[comm].keys()
        joined = job.joined.setdefault(comm, deque())
        added = set()
        for seqs, (rids, rows) in groups.items():
            # every rank of the communicator, each once (a host watched under two addresses feeds its ranks
            # twice), and no other collectives reported in it this round
            everyone = len(groups) == 1 and len(rids) == len(members) >= 2 and members == set(rids)
            for seq, column in zip(seqs, zip(*rows, strict=True), strict=True):
                if everyone and seq not in pending:
                    _settle(joined, now, seq, rids, column)
                    continue
                starts = pending.get(seq)
                if starts is None:
                    starts = pending[seq] = {}
                    job.first_seen[comm, seq] = now
                starts.update(zip(rids, column, strict=True))
                added.add(seq)
        for seq in sorted(added):
            starts = pending[seq]
            if len(starts) >= 2 and members <= starts.keys():
                del pending[seq], job.first_seen[comm, seq]
                _settle(joined, now, seq, list(starts), list(starts.values()))


def _settle(joined: deque[_Joined], now: float, seq: int, rids: Sequence[int], starts: Sequence[int]) -> None:
    """Charge a collective, every rank's start in hand (in the same order as ``rids``), to the last to start."""
    figures = arrivals(starts)
    joined.append((now, seq, figures.latest, rids[figures.last], figures.held_us))


def _expire(job: _Job, now: float) -> None:
    for comm, seq in [key for key, seen in job.first_seen.items() if now - seen > SETTLE_S]:
        del job.pending[comm][seq], job.first_seen[comm, seq]
    live = {job.ids[key] for key in job.ranks if key in job.ids}
    for comm, members in job.members.items():
        job.members[comm] = {rid: seen for rid, seen in members.items() if now - seen <= WINDOW_S and rid in live}
    # What each snapshot brought covers the interval before it: the last WINDOW_S of them, strictly,
    # span WINDOW_S, as the step counts below do from their first to their last.
    for joined in job.joined.values():
        while joined and now - joined[0][0] >= WINDOW_S:
            joined.popleft()
    for rank in job.ranks.values():
        newest_step = rank.steps[-1][0]  # on the host's clock, or the judge's
        while len(rank.steps) > 1 and newest_step - rank.steps[0][0] > WINDOW_S:
            rank.steps.popleft()
        while len(rank.signals) > 1 and now - rank.signals[0][0] > WINDOW_S:
            rank.signals.popleft()


def _joined_count(job: _Job) -> int:
    """The collectives joined in the window, in all communicators."""
    return sum(map(len, job.joined.values()))


def _job_step_seconds(job: _Job) -> float | None:
    """The job's step time in the window: the median over ranks of time per step."""
    per_rank = []
    for rank in job.ranks.values():
        (t0, s0), (t1, s1) = rank.steps[0], rank.steps[-1]
        if s1 - s0 >= 2:
            per_rank.append((t1 - t0) / (s1 - s0))
    return statistics.median(per_rank) if per_rank else None


def _costs(job: _Job, step: float | None) -> list[pb.RankCost]:
    """Every rank's cost per step, costliest first: what its peers lost waiting for it.

    Per step of the late rank (between its step ends), from the collectives it was last at:
    - where the starts are kernel starts (NCCL), the sum of its lateness: a kernel starts only
      after the one before ended, so each collective's lateness is what the rank added there;
      averaged over the steps' worth of collectives joined in the window;
    - where they are CPU enqueue times (gloo), the largest: the others enqueue a step's
      collectives without waiting, so the rank is late at each by all it lost so far, and the
      step's last lateness is the step's loss; averaged over the steps with one joined.
    Without step ends (no optimizer step seen): the lateness per communicator over the window,
    the largest, per second."""
    ref_ends = next((r.step_ends for r in job.ranks.values() if r.step_ends), [])
    ends_of = {job.ids[key]: rank.step_ends for key, rank in job.ranks.items() if key in job.ids}
    largest: dict[tuple[int, int], float] = {}  # (rank id, step) → its largest lateness (enqueue times)
    # (rank id, step) → its lateness summed in a communicator, the largest over communicators (kernel
    # starts): a rank late to a step is late in each communicator it is in (its tensor- and data-parallel
    # groups), and the others wait for it once
    largest_summed: dict[tuple[int, int], float] = {}
    per_comm: dict[tuple[int, str], float] = {}
    for comm, joined in job.joined.items():
        enqueued = job.enqueued.get(comm)
        summed: dict[tuple[int, int], float] = {}  # (rank id, step) → its lateness summed in this communicator
        for _, _, at, rid, ns in joined:
            ends = ends_of.get(rid)
            if not (ends and ref_ends):
                per_comm[rid, comm] = per_comm.get((rid, comm), 0.0) + ns * 1e-9
            elif enqueued:
                rank_step = rid, bisect.bisect_left(ends, at)
                largest[rank_step] = max(largest.get(rank_step, 0.0), ns * 1e-9)
            else:
                rank_step = rid, bisect.bisect_left(ends, at)
                summed[rank_step] = summed.get(rank_step, 0.0) + ns * 1e-9
        for rank_step, seconds in summed.items():
            largest_summed[rank_step] = max(largest_summed.get(rank_step, 0.0), seconds)
    held: dict[int, float] = {}
    for per_step, steps in ((largest, _steps_joined(job, ref_ends, True)),
                            (largest_summed, _steps_joined(job, ref_ends, False))):
        totals: dict[int, float] = {}
        for (rid, _), seconds in per_step.items():
            totals[rid] = totals.get(rid, 0.0) + seconds / steps
        for rid, total in totals.items():
            held[rid] = max(held.get(rid, 0.0), total)
    span = max((r.steps[-1][0] - r.steps[0][0] for r in job.ranks.values()), default=0.0)
    for (rid, _), seconds in per_comm.items():
        held[rid] = max(held.get(rid, 0.0), seconds / span if span else 0.0)
    costs = []  # (sort key: costliest first, then by rank or pid; the rank's cost)
    for key, rank in job.ranks.items():
        feed = rank.feed
        per = held.get(job.ids.get(key, -1), 0.0)
        cost = pb.RankCost(pid=feed.pid, host=feed.host, cost_seconds=per,
                           cost_percent=100 * per / step if step else 0.0)
        if feed.rank is not None:
            cost.rank = feed.rank
        if feed.gpu is not None:
            cost.gpu = feed.gpu.index
        costs.append(((-per, feed.pid if feed.rank is None else feed.rank), cost))
    costs.sort(key=lambda ordered: ordered[0])
    return [cost for _, cost in costs]


def _bound(costs: list[pb.RankCost], step: float | None, baseline: float | None) -> dict[RankKey, float]:
    """Each rank's cost at most the step's rise over the healthy baseline (judged so over the job's
    collectives: a rank late since before they could be joined has none to be bounded by). A rank the
    others wait for at every collective while the step is what it was when healthy costs the job
    nothing: its lateness is a phase its compute keeps, which the sum charges again at each collective.
    The step time counts whole steps in the window, so the rise is known to one step in it
    (step² / WINDOW_S) and the bound allows that. The ranks whose cost that lowered, with what the
    others waited for them per step."""
    if step is None or baseline is None:
        return {}
    rise = max(0.0, step - baseline) + step * step / WINDOW_S
    waited = {}
    for cost in costs:
        if cost.cost_seconds > rise:
            waited[cost.host, cost.pid] = cost.cost_seconds
            cost.cost_seconds, cost.cost_percent = rise, 100 * rise / step
    return waited


def _steps_joined(job: _Job, ref_ends: list[int], enqueued: bool) -> float:
    """The steps the window's joined collectives of one kind cover. Enqueue times: the steps with one
    joined (any of a step's collectives carries the step's lateness). Kernel starts: the steps' worth
    of collectives joined, per communicator those joined over its collectives per step (sequence
    numbers over steps, between the first and the last joined), the largest; not the steps with one
    joined: a sample's block covers parts of the steps at its edges."""
    of_kind = [joined for comm, joined in job.joined.items() if joined and job.enqueued.get(comm, False) == enqueued]
    if enqueued:
        return float(len({bisect.bisect_left(ref_ends, at) for joined in of_kind for _, _, at, _, _ in joined}))
    best = 0.0
    for joined in of_kind:
        seqs = [seq for _, seq, _, _, _ in joined]
        times = [at for _, _, at, _, _ in joined]
        steps = bisect.bisect_left(ref_ends, max(times)) - bisect.bisect_left(ref_ends, min(times)) + 1
        best = max(best, len(joined) * steps / (max(seqs) - min(seqs) + 1))
    return best


def _culprits(costs: list[pb.RankCost], step: float | None) -> list[pb.RankCost]:
    """The ranks the others wait for: the costliest when it stands out (see the module's docstring)."""
    if step is None or not costs or costs[0].cost_seconds < COST_MIN_FRACTION * step:
        return []
    runner_up = costs[1].cost_seconds if len(costs) > 1 else 0.0
    if costs[0].cost_seconds < DOMINANCE * runner_up:
        return []
    return [c for c in costs if c.cost_seconds >= max(COST_MIN_FRACTION * step, costs[0].cost_seconds / DOMINANCE)]


def _culprits_of_last(job: _Job) -> list[pb.RankCost]:
    """While a slow verdict holds without a culprit now, the one it named last."""
    return list(job.verdict.culprits) if job.verdict is not None else []


# ---------------------------------------------------------------- cause

def _explain(verdict: pb.JobSlowdown, job: _Job, culprits: list[pb.RankCost], costs: list[pb.RankCost],
             waited: dict[RankKey, float], step: float | None, baseline: float | None) -> None:
    by_rank = {(c.host, c.pid): c for c in costs}  # a culprit named last time carries this window's cost
    verdict.culprits.extend(by_rank.get((c.host, c.pid), c) for c in culprits)
    if culprits:
        verdict.cost_seconds = sum(c.cost_seconds for c in verdict.culprits)
        verdict.cost_percent = sum(c.cost_percent for c in verdict.culprits)
        culprit = job.ranks.get((verdict.culprits[0].host, verdict.culprits[0].pid))
        if culprit is not None:
            verdict.cause = _rank_cause(verdict, job, culprit, verdict.culprits[0], waited, step, baseline)
            return
    if step is not None and baseline is not None:
        verdict.cost_seconds = max(0.0, step - baseline)
        verdict.cost_percent = 100 * verdict.cost_seconds / step
    verdict.cause = _job_cause(verdict, job, step, baseline)


def _rank_cause(verdict: pb.JobSlowdown, job: _Job, culprit: _Rank, cost: pb.RankCost, waited: dict[RankKey, float],
                step: float | None, baseline: float | None) -> pb.SlowdownCause:
    who = rank_or_pid(culprit.feed.rank, culprit.feed.pid)
    peers = [r for key, r in job.ranks.items() if key != culprit.feed.key]
    cost_per_s = cost.cost_seconds / step if step else 0.0
    held = waited.get(culprit.feed.key, cost.cost_seconds)
    verdict.evidence.append(
        f"the others waited for {who} ({culprit.feed.host}) at collectives: {held * 1e3:.1f} ms "
        f"per step ({100 * held / step if step else 0.0:.0f} % of a {(step or 0) * 1e3:.1f} ms step), over "
        f"{_joined_count(job)} collectives joined in the last {WINDOW_S:g} s")
    if culprit.feed.key in waited and baseline is not None and step is not None:
        verdict.evidence.append(
            f"the step grew {(step - baseline) * 1e3:.1f} ms over its healthy {baseline * 1e3:.1f} ms: {who}'s cost "
            f"is at most that ({cost.cost_seconds * 1e3:.1f} ms, to one step in the window); the rest of the wait "
            f"is gaps between its collectives that the healthy step has too")
    if culprit.stopped:
        verdict.evidence.append(f"{who}'s process was seen stopped (SIGSTOP, a debugger or job control) in "
                                f"{len(culprit.stopped)} snapshot(s) in the last {STOPPED_MEMORY_S:g} s")
        return pb.SLOWDOWN_CAUSE_STOPPED
    for signal, cause, doing in _SIGNAL_CAUSES:
        own, others = _mean_signal(culprit, signal), _median([_mean_signal(p, signal) for p in peers])
        if own is None:
            verdict.unchecked.append(f"{signal} of {who}: {culprit.feed.missing.get(signal, 'not reported')}")
            continue
        excess = own - (others or 0.0)
        if cost_per_s and excess >= SIGNAL_SHARE * cost_per_s:
            verdict.evidence.append(f"{who} {doing} {own * 1e3:.0f} ms per second against "
                                    f"{(others or 0.0) * 1e3:.0f} ms on its peers (median)")
            return cause
    gpu = culprit.feed.gpu
    if gpu is None:
        verdict.unchecked.append(f"GPU of {who}: {culprit.feed.missing.get('gpu', 'unknown')}")
    else:
        job_pids = {key[1] for key in job.ranks if key[0] == culprit.feed.host}
        intruders = [(pid, share) for pid, share in gpu.processes if pid not in job_pids]
        if intruders:
            shares = ", ".join(f"pid {pid}" + (f" ({share:.0f} % SM)" if share is not None else "")
                               for pid, share in intruders)
            verdict.evidence.append(f"GPU {gpu.index} of {who} also runs {shares}")
            return pb.SLOWDOWN_CAUSE_GPU_CONTENTION
        slower = _slower_gemm(culprit, peers)
        if slower:
            verdict.evidence.append(slower)
            verdict.evidence.extend(_gpu_facts(gpu, [p.feed.gpu for p in peers if p.feed.gpu is not None]))
            return pb.SLOWDOWN_CAUSE_GPU_SLOWER
    verdict.evidence.append("checked, and like its peers in each: " + ", ".join(
        f"{s} {_fmt(_mean_signal(culprit, s))}" for s in SIGNALS))
    return pb.SLOWDOWN_CAUSE_UNKNOWN


def _job_cause(
    verdict: pb.JobSlowdown, job: _Job, step: float | None, baseline: float | None
) -> pb.SlowdownCause:
    if step is None or baseline is None:
        verdict.evidence.append("the step time rose, and no rank held the others up")
        return pb.SLOWDOWN_CAUSE_UNKNOWN
    verdict.evidence.append(f"the step takes {step * 1e3:.1f} ms against {baseline * 1e3:.1f} ms before, and no "
                            f"rank held the others up at collectives ({_joined_count(job)} joined in {WINDOW_S:g} s)")
    comm = _median([r.feed.comm_seconds_per_s for r in job.ranks.values()])
    comm_baseline = statistics.median(job.comm_baseline) if job.comm_baseline else None
    if comm is None or comm_baseline is None:
        verdict.unchecked.append("time in NCCL kernels: no NCCL figures (no hook plugin, or not an NCCL job)")
        return pb.SLOWDOWN_CAUSE_UNKNOWN
    grew = comm * step - comm_baseline
    verdict.evidence.append(f"time in NCCL kernels per step {comm * step * 1e3:.1f} ms against "
                            f"{comm_baseline * 1e3:.1f} ms before")
    return pb.SLOWDOWN_CAUSE_SLOW_COMMUNICATION if grew >= 0.5 * (step - baseline) else pb.SLOWDOWN_CAUSE_UNKNOWN


def _slower_gemm(culprit: _Rank, peers: list[_Rank]) -> str:
    """A sentence on the shape the culprit runs slowest against its peers, or ""."""
    worst, worst_ratio = "", GEMM_SLOWER
    for shape, own in culprit.gemm.items():
        theirs = _median([p.gemm.get(shape) for p in peers])
        if theirs and own / theirs >= worst_ratio:
            worst_ratio = own / theirs
            worst = (f"{rank_or_pid(culprit.feed.rank, culprit.feed.pid)}'s GEMMs {shape} take "
                     f"{own * 1e6:.0f} µs against {theirs * 1e6:.0f} µs on its peers ({worst_ratio:.2f}×)")
    return worst


def _gpu_facts(gpu: GpuFeed, peers: list[GpuFeed]) -> list[str]:
    facts = []
    peer_clock = _median([p.sm_clock_hz for p in peers])
    if gpu.sm_clock_hz is not None and peer_clock:
        facts.append(f"GPU {gpu.index} SM clock {gpu.sm_clock_hz / 1e6:.0f} MHz against {peer_clock / 1e6:.0f} MHz "
                     "on its peers' GPUs")
    if gpu.power_limit_watts is not None:
        peer_limit = _median([p.power_limit_watts for p in peers])
        facts.append(f"GPU {gpu.index} power {_fmt(gpu.power_watts, 'W')} of a {gpu.power_limit_watts:.0f} W cap"
                     + (f" (peers' cap {peer_limit:.0f} W)" if peer_limit else ""))
    if gpu.clock_event_reasons:
        facts.append(f"GPU {gpu.index} clock event reasons: {', '.join(gpu.clock_event_reasons)}")
    return facts


def _mean_signal(rank: _Rank, signal: str) -> float | None:
    """The signal's mean over the rank's last SIGNAL_SNAPSHOTS snapshots (the window's start may predate the cause)."""
    values = [v[signal] for _, v in list(rank.signals)[-SIGNAL_SNAPSHOTS:] if signal in v]
    return sum(values) / len(values) if values else None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, unit: str = "s/s") -> str:
    return "unavailable" if value is None else f"{value:.3g} {unit}"
