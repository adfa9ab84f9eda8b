"""Per-rank hang verdicts from what the ranks collector reports, explained in words.

Signals, per rank: the oldest collective launched and not finished (from the
hook library's NCCL in-flight table, and PyTorch Flight Recorder's counters
for any backend where the startup hook publishes them), step progress (no optimizer step for
``STALL_FACTOR`` × the rank's recent median step time, and at least the
configured seconds), and the process state the ranks collector read from /proc
in the same tick (after checking the pid still names the rank's process). CPU use is
deliberately not a signal: a rank waiting in a CUDA sync spins, a culprit
sleeping in Python looks idle. A rank is a *suspect* past the suspect level and
*hung* past the hang timeout; a rank that is slow but still stepping is neither.

An in-flight age is the writer's claim (the segment is the rank's own memory,
and any local user can write one): the detector trusts an age only as far as it
watched the operation stay in flight itself, plus ``PUBLISH_ALLOWANCE_S`` for
how late an honest writer publishes it (the Flight Recorder publisher waits 2 s
before listing pending collectives), so a forged "launched an hour ago" waits
out the timeout like any real collective.
"""

from __future__ import annotations

import signal
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import rank_state
from agentd.stacks.verdicts import summarize, who as rank_label
from agentd.stacks.collectives import findings, short_comm
from agentd.stacks.wire import COLLECTIVE_KINDS, collectives_from_ranks

OK, SUSPECT, HUNG, EXITED = pb.HANG_LEVEL_OK, pb.HANG_LEVEL_SUSPECT, pb.HANG_LEVEL_HUNG, pb.HANG_LEVEL_EXITED
_SEVERITY = {OK: 0, EXITED: 1, SUSPECT: 2, HUNG: 3}
_GONE = (pb.RANK_STATE_EXITED, pb.RANK_STATE_ZOMBIE)
_HELD = (pb.RANK_STATE_STOPPED, pb.RANK_STATE_DISK_SLEEP)  # not running, and not by its own choice
STALL_FACTOR = 5.0        # NVRx's safety factor on observed step intervals
STEP_HISTORY = 20
PUBLISH_ALLOWANCE_S = 3.0


class HangConfigError(ValueError):
    """Hang thresholds that do not make sense together."""


@dataclass
class _RankTrack:
    """What the detector remembers of one rank process between snapshots."""

    step_count: int = 0
    last_step_at: float | None = None     # monotonic time the step count last changed
    step_intervals: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    bad_state_since: float | None = None


# An in-flight operation is the same one while these stay the same.
_InflightKey = tuple[int, str, str, str, int, int]


class InflightClock:
    """When the detector first saw each in-flight operation, to bound the ages ranks report."""

    def __init__(self) -> None:
        self._first_seen: dict[_InflightKey, float] = {}

    def trusted(self, ranks: Sequence[pb.RankStats], now: float) -> list[pb.RankStats]:
        """``ranks`` with every in-flight age cut to how long it has been seen in flight (plus the allowance).

        Ranks without in-flight operations are passed through; the others are copies.
        """
        seen: dict[_InflightKey, float] = {}
        out = []
        for rank in ranks:
            if not rank.inflight:
                out.append(rank)
                continue
            copy = pb.RankStats()
            copy.CopyFrom(rank)
            for op in copy.inflight:
                key = (rank.pid, op.kind, op.op, op.comm_hash, op.sequence, op.stream)
                first = seen[key] = self._first_seen.get(key, now)
                op.age_seconds = min(op.age_seconds, now - first + PUBLISH_ALLOWANCE_S)
            out.append(copy)
        self._first_seen = seen  # operations no longer in flight are forgotten
        return out


@dataclass(frozen=True)
class Thresholds:
    suspect_s: float
    hang_s: float

    def __post_init__(self) -> None:
        if not 0 < self.suspect_s <= self.hang_s:
            raise HangConfigError(
                f"the suspect level ({self.suspect_s:g} s) must be above 0 and at most the hang "
                f"timeout ({self.hang_s:g} s); lower --hang-suspect-s or raise --hang-timeout-s"
            )


class HangDetector:
    """Turns successive RankStats lists into a HangStatus."""

    def __init__(
        self,
        thresholds: Thresholds,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.thresholds = thresholds
        self._clock = clock
        self._wall_ns = wall_clock_ns
        self._tracks: dict[int, _RankTrack] = {}
        self._inflight = InflightClock()
        self._since_ns = 0
        self._level = OK

    def observe(self, ranks: Sequence[pb.RankStats]) -> pb.HangStatus:
        now = self._clock()
        ranks = self._inflight.trusted(ranks, now)
        self._tracks = {r.pid: self._tracks.get(r.pid) or _RankTrack() for r in ranks}
        notes, waited = _collective_notes(ranks)
        verdicts = [self._verdict(r, self._tracks[r.pid], now, notes.get(r.pid), waited.get(r.job_id, 0.0))
                    for r in ranks]
        level = max((v.level for v in verdicts if v.level != EXITED), key=_SEVERITY.__getitem__, default=OK)
        exits = [v for r, v in zip(ranks, verdicts, strict=True) if _exit_matters(r, v, ranks, verdicts)]
        if level == OK and exits:
            level = SUSPECT  # a rank died or left early: the others will wait for it
        if level != OK and self._level == OK:
            self._since_ns = self._wall_ns()
        self._level = level
        status = pb.HangStatus(level=level, ranks=verdicts)
        if level != OK:
            status.since_unix_ns = self._since_ns
            status.explanation = summarize([v for v in verdicts if v.level in (HUNG, SUSPECT)] + exits)
        return status

    def _verdict(
        self, rank: pb.RankStats, track: _RankTrack, now: float, note: str | None, waited: float
    ) -> pb.RankVerdict:
        verdict = pb.RankVerdict(pid=rank.pid)
        if rank.HasField("rank"):
            verdict.rank = rank.rank
        who = rank_label(rank)  # the prefix stacks_verdicts.finding strips
        state = rank_state(rank.state)
        if rank.state in _GONE:
            verdict.level, verdict.explanation = EXITED, f"{who}: {_exit_text(rank, state)}"
            return verdict
        self._track_steps(rank, track, now)
        reasons: list[tuple[pb.HangLevel, str]] = []
        if rank.state in _HELD:
            track.bad_state_since = track.bad_state_since or now
            held = now - track.bad_state_since
            what = ("in D state (uninterruptible I/O wait)" if rank.state == pb.RANK_STATE_DISK_SLEEP
                    else f"{state} (SIGSTOP or a debugger)")
            reasons.append((self._level_for(held, immediate=True), f"{what} for {held:.0f} s"))
        else:
            track.bad_state_since = None
        oldest = max((op for op in rank.inflight if op.kind in COLLECTIVE_KINDS), key=lambda op: op.age_seconds,
                     default=None)
        if oldest is not None:
            text = (f"{oldest.op} #{oldest.sequence} on comm {short_comm(oldest.comm_hash)} launched "
                    f"{oldest.age_seconds:.0f} s ago, not finished")
            reasons.append((self._level_for(oldest.age_seconds), f"{text}; {note}" if note else text))
        elif note:
            reasons.append((self._level_for(waited), note))
        stall = self._stall(track, now)
        if stall is not None:
            seconds, slow_limit = stall
            reasons.append((self._level_for(seconds, at_least=slow_limit),
                            f"no optimizer step for {seconds:.0f} s (step {track.step_count}"
                            + (f", median step {statistics.median(track.step_intervals):.2f} s)"
                               if track.step_intervals else ")")))
        worst = max((lvl for lvl, _ in reasons), key=_SEVERITY.__getitem__, default=OK)
        verdict.level = worst
        shown = [text for lvl, text in reasons if lvl != OK]
        if shown and rank.exception:  # a thread that died may be why the rank waits
            shown.append(f"earlier {_exception_summary(rank.exception)}")
        quiet = f"{state}, at step {track.step_count}" if track.step_count else f"{state}, no step recorded yet"
        verdict.explanation = f"{who}: " + ("; ".join(shown) if shown else quiet)
        return verdict

    def _track_steps(self, rank: pb.RankStats, track: _RankTrack, now: float) -> None:
        if rank.step_count != track.step_count:
            if track.last_step_at is not None and rank.step_count > track.step_count:
                per_step = (now - track.last_step_at) / (rank.step_count - track.step_count)
                track.step_intervals.append(per_step)
            track.step_count = rank.step_count
            track.last_step_at = now

    def _stall(self, track: _RankTrack, now: float) -> tuple[float, float] | None:
        """Seconds since the last step, and STALL_FACTOR × the median step (for ranks that stepped)."""
        if track.last_step_at is None or track.step_count == 0:
            return None
        median = statistics.median(track.step_intervals) if track.step_intervals else 0.0
        return now - track.last_step_at, STALL_FACTOR * median

    def _level_for(self, seconds: float, immediate: bool = False, at_least: float = 0.0) -> pb.HangLevel:
        """The level ``seconds`` of no progress reach; ``at_least`` raises both limits (slow jobs)."""
        if seconds >= max(self.thresholds.hang_s, at_least):
            return HUNG
        if immediate or seconds >= max(self.thresholds.suspect_s, at_least):
            return SUSPECT
        return OK


def _collective_notes(ranks: Sequence[pb.RankStats]) -> tuple[dict[int, str], dict[str, float]]:
    """Per pid, what the collectives of its job say; per job, the longest wait in a collective.

    Ranks are compared within their job only: two jobs on one host both have a rank 0.
    """
    jobs: dict[str, list[pb.RankStats]] = {}
    for rank in ranks:
        jobs.setdefault(rank.job_id, []).append(rank)
    notes: dict[int, str] = {}
    waited: dict[str, float] = {}
    for job, members in jobs.items():
        by_rank = findings(collectives_from_ranks(members))
        notes.update((r.pid, by_rank[r.rank]) for r in members if r.HasField("rank") and r.rank in by_rank)
        waited[job] = max((op.age_seconds for r in members for op in r.inflight if op.kind in COLLECTIVE_KINDS),
                          default=0.0)
    return notes, waited


def _exit_matters(
    rank: pb.RankStats, verdict: pb.RankVerdict, ranks: Sequence[pb.RankStats], verdicts: Sequence[pb.RankVerdict]
) -> bool:
    """An exited rank that failed, or that left while ranks of its job still run."""
    if verdict.level != EXITED:
        return False
    status_known = rank.HasField("exit_signal") or rank.HasField("exit_code")
    # SIGTERM is how launchers and schedulers stop a job: a failure only while its job runs on.
    killed = rank.HasField("exit_signal") and (rank.exit_signal != signal.SIGTERM or bool(rank.exception))
    failed = killed or (rank.HasField("exit_code") and rank.exit_code != 0) or (
        rank.exception and not status_known)  # exit code 0 after a thread's exception: the program finished
    others_run = any(r.job_id == rank.job_id and v.level != EXITED for r, v in zip(ranks, verdicts, strict=True))
    return bool(failed) or others_run


def _exit_text(rank: pb.RankStats, state: str) -> str:
    if rank.HasField("exit_signal") and rank.exit_signal == signal.SIGTERM:
        text = f"stopped by signal {rank.exit_signal} (SIGTERM)"
    elif rank.HasField("exit_signal"):
        text = f"killed by signal {rank.exit_signal} ({_signal_name(rank.exit_signal)})"
    elif rank.HasField("exit_code"):
        text = f"exited with code {rank.exit_code}"
    else:
        text = f"process {state}; exit status unknown"
        why = rank.unavailable.get("exit_code")
        if why:
            text += f" ({why})"
    if rank.exception:
        text += f" after {_exception_summary(rank.exception)}"
    return text


def hide_exceptions(status: pb.HangStatus, exceptions: Sequence[str]) -> pb.HangStatus:
    """A copy of ``status`` whose explanations do not quote ``exceptions`` (other users' text)."""
    hidden = pb.HangStatus()
    hidden.CopyFrom(status)
    hidden.explanation = hide_exception_text(hidden.explanation, exceptions)
    for verdict in hidden.ranks:
        verdict.explanation = hide_exception_text(verdict.explanation, exceptions)
    return hidden


def hide_exception_text(text: str, exceptions: Sequence[str]) -> str:
    """``text`` with the summary this module quotes of each of ``exceptions`` replaced by a notice."""
    for exception in exceptions:
        if exception.strip():
            text = text.replace(_exception_summary(exception), "an uncaught exception (text shown to its owner only)")
    return text


def _exception_summary(exception: str) -> str:
    """'an uncaught exception[ in thread T]: <its last line>' from the startup hook's traceback text."""
    lines = exception.strip().splitlines()
    if not lines:  # the ranks collector drops blank text; a blank claim must still not stop detection
        return "an uncaught exception (no text recorded)"
    where = ""
    if lines[0].startswith("Exception in thread ") and lines[0].endswith(":"):
        where = f" in thread {lines[0].removeprefix('Exception in thread ').removesuffix(':')}"
    return f"an uncaught exception{where}: {lines[-1]}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
