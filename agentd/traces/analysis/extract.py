"""From one rank's decoded Chrome trace to the extract its summary needs and its collective calls.

A first pass (``first_pass``) finds the steps, each launch call by correlation
id and the collective CPU ops; then one pass over the events
(``RankExtractor.add`` per complete event) fills a ``RankExtract``: GPU events
count when their launch call (the event's own start when the launch is not in
the trace) is in the ``--steps`` window, CPU ops when they start in it. The
agent runs it on its ranks' files with each file's own time base; the
console's merge runs it while rewriting events onto the shared base
(``tuiprof.analysis.trace_merge``). ``like_hta`` (``--like-hta``) counts as
HTA 0.5 does: times rounded to whole µs, GPU work whose launch is not in the
trace left out (with two or more ProfilerSteps), communication by name alone.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import msgspec

from agentd.traces.analysis.summary import (
    CPU_OP_CATEGORIES, GPU_CATEGORIES, KERNEL_CATEGORIES, RUNTIME_CATEGORIES, SHORT_KERNEL_US, RankExtract, RankResult,
    StepWindow, hta_times, hta_window, kernel_kind, step_window, summarize_rank,
)

# CPU ops that are collectives (gloo, or c10d's dispatcher ops), linked when a rank has no GPU kernels.
CPU_COLLECTIVE_PREFIXES = ("c10d::", "gloo:")
GLOO_PREFIX = "gloo:"
STEP_PREFIXES = ("ProfilerStep#", "Optimizer.step#")
# Where step annotations are: record_function spans; PyTorch 1.8/1.9 (2021) filed them under "Operator".
STEP_CATEGORIES = frozenset({"user_annotation", "Operator"})
# The categories RankExtractor.add counts (runtime calls, a third of a trace's events, only pair launches).
ADDED_CATEGORIES = GPU_CATEGORIES | CPU_OP_CATEGORIES | {"user_annotation"}
# CPU ops (record functions) that run a collective, whose kernels are communication whatever their name (Kineto
# links a kernel to the innermost op around its launch by ``External id``): c10d's record_param_comms (around each
# NCCL/RCCL launch), ProcessGroupNCCL's nccl:* and gloo's gloo:* spans, the c10d:: and _c10d_functional:: ops,
# PyTorch's symmetric-memory ops (symm_mem::multimem_all_reduce_, one_shot_all_reduce, …) and vLLM's custom
# all-reduce (_C_custom_ar::all_reduce).
COLLECTIVE_OPS = re.compile(r"record_param_comms$|nccl:|gloo:|c10d::|_c10d_functional::|symm_mem::|_C_custom_ar::")
COLLECTIVE_OP_CATEGORIES = CPU_OP_CATEGORIES | {"user_annotation"}


class Event(msgspec.Struct, omit_defaults=True):
    ph: str = ""
    cat: str | msgspec.UnsetType = msgspec.UNSET
    name: str | msgspec.UnsetType = msgspec.UNSET
    pid: int | str | msgspec.UnsetType = msgspec.UNSET
    tid: int | str | msgspec.UnsetType = msgspec.UNSET
    ts: float | msgspec.UnsetType = msgspec.UNSET
    dur: float | msgspec.UnsetType = msgspec.UNSET
    id: int | str | msgspec.UnsetType = msgspec.UNSET
    bp: str | msgspec.UnsetType = msgspec.UNSET
    s: str | msgspec.UnsetType = msgspec.UNSET
    args: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class Distributed(msgspec.Struct):
    rank: int | None = None
    pg_config: msgspec.Raw = msgspec.Raw(b"[]")  # the rank's process groups, read by the console's merge


class TraceFile(msgspec.Struct):
    traceEvents: list[Event]
    baseTimeNanoseconds: int = 0
    distributedInfo: Distributed | None = None


class _CollectiveArgs(msgspec.Struct):
    collective: str | None = msgspec.field(default=None, name="Collective name")
    group: str | None = msgspec.field(default=None, name="Process Group Name")
    seq: int | None = None
    comm: str | None = None


class _GpuArgs(msgspec.Struct):
    correlation: int | None = None
    stream: int | str | None = None
    external: int | None = msgspec.field(default=None, name="External id")  # the CPU op that launched it
    collective: str | None = msgspec.field(default=None, name="Collective name")  # on NCCL/RCCL kernels


class _OpArgs(msgspec.Struct):
    external: int | None = msgspec.field(default=None, name="External id")


_decode_gpu_args = msgspec.json.Decoder(_GpuArgs).decode
_decode_op_args = msgspec.json.Decoder(_OpArgs).decode
_decode_collective = msgspec.json.Decoder(_CollectiveArgs).decode
_NO_GPU_ARGS = _GpuArgs()


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    group: str
    name: str
    seq: int | None  # the real sequence number, when the trace has one
    ts: float  # start, µs on the extract's time base
    end: float
    pid: int | str
    tid: int | str
    on_gpu: bool  # a GPU kernel (NCCL): waits inside itself for the last rank


def gpu_args(event: Event) -> _GpuArgs:
    if event.args is msgspec.UNSET:
        return _NO_GPU_ARGS
    try:
        return _decode_gpu_args(event.args)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _NO_GPU_ARGS


def track(value: int | str | msgspec.UnsetType) -> int | str:
    """A pid or tid; "" for an event without one."""
    return "" if value is msgspec.UNSET else value


@dataclass
class FirstPass:
    """What counting a rank's events needs to know of all of them first."""

    steps: list[tuple[str, float, float]] = field(default_factory=list)  # step annotations: name, ts, dur
    launches: dict[int, float] = field(default_factory=dict)  # correlation id -> its launch call's start
    collective_ops: set[int] = field(default_factory=set)  # External ids of the CPU ops that run a collective


def first_pass(events: Iterable[Event], shift_us: float, found: FirstPass, like_hta: bool = False) -> None:
    """Add the events' step annotations, launch calls (times shifted; ``like_hta``: rounded first, as HTA rounds)
    and collective CPU ops to ``found``."""
    for event in events:
        name, ts, dur = event.name, event.ts, event.dur
        if event.ph != "X" or ts is msgspec.UNSET or dur is msgspec.UNSET or name is msgspec.UNSET:
            continue
        if like_hta:
            ts, dur = hta_times(ts, dur)
        if event.cat in RUNTIME_CATEGORIES:
            if (correlation := gpu_args(event).correlation) is not None:
                found.launches[correlation] = ts + shift_us
        elif event.cat in STEP_CATEGORIES and name.startswith(STEP_PREFIXES):
            found.steps.append((name, ts + shift_us, dur))
        elif event.cat in COLLECTIVE_OP_CATEGORIES and COLLECTIVE_OPS.match(name) and event.args is not msgspec.UNSET:
            try:
                external = _decode_op_args(event.args).external
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if external is not None:
                found.collective_ops.add(external)


def step_windows(steps: list[tuple[str, float, float]]) -> list[tuple[float, float]]:
    """Each step's (start, end) in time order: the ProfilerStep# spans, else from one Optimizer.step# start
    to the next (on-demand traces have no ProfilerStep#)."""
    profiler = sorted((ts, ts + dur) for name, ts, dur in steps if name.startswith("ProfilerStep#"))
    if profiler:
        return profiler
    starts = sorted(ts for name, ts, _ in steps if name.startswith("Optimizer.step#"))
    return list(pairwise(starts))


def _in_window(steps: list[tuple[str, float, float]], window: StepWindow) -> list[tuple[str, float, float]]:
    return [(name, ts, dur) for name, ts, dur in steps if window.contains(ts) and window.contains(ts + dur)]


def _add(totals: dict[str, list[float]], name: str, dur: float) -> None:
    """One more call of ``name`` lasting ``dur`` µs in a name → [count, total µs] table."""
    entry = totals.get(name)
    if entry is None:
        totals[name] = [1, dur]
    else:
        entry[0] += 1
        entry[1] += dur


class RankExtractor:
    """Fills ``extract`` from a rank's events, one complete event (``ph`` X) at a time.

    ``found`` is the rank's ``first_pass`` over all its events, on the caller's
    time base (0 shift: the file's own), with the same ``like_hta``.
    """

    def __init__(self, extract: RankExtract, found: FirstPass, step_mode: str, like_hta: bool = False) -> None:
        self.extract = extract
        self._launches, self._collective_ops, self._like_hta = found.launches, found.collective_ops, like_hta
        steps = found.steps
        hta = hta_window(steps, step_mode) if like_hta else None
        self._window = hta or step_window(steps, step_mode)
        extract.steps, extract.window = _in_window(steps, self._window), self._window.description
        # Where HTA filters by its window, it keeps only the GPU work whose launch call is in the trace.
        self._unlaunched_left_out = hta is not None
        if self._unlaunched_left_out:
            extract.window += "; GPU work launched before the trace left out"
        self._start, self._end = self._window.start, self._window.end  # the window's bounds, read per event
        windows = step_windows(extract.steps)
        self._step_starts, self._step_ends = [start for start, _ in windows], [end for _, end in windows]
        self._kinds: dict[tuple[str, bool], str] = {}  # (name, recorded as a collective) -> kind
        self._gpu_collectives: list[tuple[Event, str, float, float]] = []  # the event, its name, start, duration
        self._cpu_collectives: list[tuple[Event, str, float, float]] = []
        self._gloo_work: list[tuple[Event, str, float, float]] = []

    def add(self, event: Event, name: str, cat: str, ts: float, dur: float) -> None:
        """One complete event with its name, category and (shifted) start and duration."""
        extract = self.extract
        if cat in GPU_CATEGORIES:
            args = gpu_args(event)
            launched = None if args.correlation is None else self._launches.get(args.correlation)
            if not self._start <= (ts if launched is None else launched) <= self._end or (
                    launched is None and self._unlaunched_left_out):
                extract.gpu_events_outside += 1
                return
            if launched is not None:
                self._note_step_start(launched, ts)
            if cat in KERNEL_CATEGORIES:
                extract.kernels += 1
                extract.short_kernels += dur < SHORT_KERNEL_US
                if launched is not None:
                    extract.launch_delays.append(ts - launched)
            recorded = cat in KERNEL_CATEGORIES and (args.collective is not None
                                                     or args.external in self._collective_ops)
            kind = self._kinds.get((name, recorded))
            if kind is None:
                kind = self._kinds[name, recorded] = kernel_kind(name, cat, recorded, self._like_hta)
            extract.intervals[kind].append((ts, ts + dur))
            stream = str(args.stream if args.stream is not None else track(event.tid))
            extract.streams.setdefault(stream, []).append((ts, ts + dur, launched))
            _add(extract.kernel_totals, name, dur)
            if kind == "communication":
                self._gpu_collectives.append((event, name, ts, dur))
        elif cat in CPU_OP_CATEGORIES and self._start <= ts <= self._end:
            _add(extract.cpu_totals, name, dur)
            if name.startswith(CPU_COLLECTIVE_PREFIXES):
                self._cpu_collectives.append((event, name, ts, dur))
                _add(extract.cpu_collective_totals, name, dur)
        elif cat == "user_annotation" and name.startswith(CPU_COLLECTIVE_PREFIXES) and self._start <= ts <= self._end:
            _add(extract.cpu_collective_totals, name, dur)  # gloo:all_reduce spans the work c10d:: only enqueues
            if name.startswith(GLOO_PREFIX):
                self._gloo_work.append((event, name, ts, dur))

    def _note_step_start(self, launched: float, ts: float) -> None:
        """A GPU event that started at ``ts``, launched at ``launched``: the earliest of its step's so far?"""
        step = bisect_right(self._step_starts, launched) - 1
        if step < 0 or launched > self._step_ends[step]:
            return  # launched between steps
        first = self.extract.step_gpu_starts.get(step)
        if first is None or ts < first:
            self.extract.step_gpu_starts[step] = ts

    def finish(self) -> list[CollectiveCall]:
        """The rank's collective calls in start order: its NCCL kernels; on CPU-only ranks gloo's ``gloo:``
        annotations, which span the work from its start until every rank has joined (so, like NCCL kernels,
        they end together on every rank), else the ``c10d::`` ops (which end once the work is enqueued)."""
        extract = self.extract
        extract.gpu_kernels = sum(len(spans) for spans in extract.intervals.values())
        on_gpu = bool(extract.gpu_kernels)
        chosen = self._gpu_collectives if on_gpu else (self._gloo_work or self._cpu_collectives)
        return sorted((_collective_call(*c, on_gpu) for c in chosen), key=lambda call: call.ts)


def rank_result(extract: RankExtract, calls: list[CollectiveCall]) -> RankResult:
    """The rank's own summary and totals; ``collectives`` is left for the cross-rank matching."""
    totals = _collective_totals(calls) if extract.gpu_kernels else extract.cpu_collective_totals
    return RankResult(summarize_rank(extract), [], extract.kernel_totals,
                      unsequenced_collectives=sum(call.seq is None for call in calls),
                      collective_totals=totals, cpu_totals=extract.cpu_totals)


def extract_rank(batches: Callable[[], Iterable[list[Event]]], extract: RankExtract, step_mode: str,
                 like_hta: bool = False) -> list[CollectiveCall]:
    """Fill ``extract`` from a rank's events on its own time base; return its collective calls.

    ``batches()`` gives the events (in batches, e.g. read from the file piece by
    piece) and is called twice: once for the ``first_pass``, once for
    everything else.
    """
    found = FirstPass()
    for batch in batches():
        first_pass(batch, 0.0, found, like_hta)
    extractor = RankExtractor(extract, found, step_mode, like_hta)
    unset, add, counted = msgspec.UNSET, extractor.add, 0
    for batch in batches():
        counted += len(batch)
        for event in batch:
            if event.ph != "X":
                continue
            ts, dur, cat, name = event.ts, event.dur, event.cat, event.name
            if ts is unset or dur is unset or cat is unset or name is unset or cat not in ADDED_CATEGORIES:
                continue
            if like_hta:
                ts, dur = hta_times(ts, dur)
            add(event, name, cat, ts, dur)
    extract.events += counted
    return extractor.finish()


# Metadata the merge replaces with its own track names (counted as the rank's events all the same).
DROPPED_METADATA = frozenset({"process_name", "process_sort_index", "process_labels"})


def _collective_totals(calls: list[CollectiveCall]) -> dict[str, list[float]]:
    """Each collective op's calls and total time on this rank's NCCL kernels."""
    totals: dict[str, list[float]] = {}
    for call in calls:
        _add(totals, call.name, call.end - call.ts)
    return totals


def _collective_call(event: Event, name: str, ts: float, dur: float, on_gpu: bool) -> CollectiveCall:
    """The collective an event runs: its op and group from Kineto's args (timeline dumps: also its sequence number)."""
    group, seq = "", None
    if event.args is not msgspec.UNSET:
        try:
            args = _decode_collective(event.args)
        except (msgspec.DecodeError, msgspec.ValidationError):
            args = _CollectiveArgs()
        name = args.collective or name
        group = args.group or args.comm or ""
        seq = args.seq
    return CollectiveCall(group, name, seq, ts, ts + dur, track(event.pid), track(event.tid), on_gpu)
