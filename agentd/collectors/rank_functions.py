"""A rank's timed Python functions (written by the startup hook's ``tuiprof_functions`` beside the
segment, once a second) as ``RankStats.functions``, with per-second rates between its two newest
publications.

The file is the job's own text: it is read like the Flight Recorder file (``SidecarFile``: a regular
file of the segment's owner, never through a link, at most 96 KiB), every figure is checked, names are
made printable and cut to ``MAX_NAME`` characters, and at most ``MAX_FUNCTIONS_PER_RANK`` functions
are taken (the startup hook times no more).

The file also answers the agent's requests to start or stop timing functions at run time
(``rank_function_requests``): the last request's serial and its problem lines, and the names waiting
for their module's import; they become ``RankStats.function_request`` and ``functions_waiting``.
Its functions' newest calls (start and duration) are what timeline dumps show of them
(``agentd.traces.timeline``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Container

from agentd.collectors.rank_files import SidecarFile
from agentd.collectors.rank_function_requests import FunctionRequest
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

FUNCTIONS_SUFFIX = ".functions"  # tuiprof_native/startup/tuiprof_functions.SUFFIX writes it
MAX_FUNCTIONS_PER_RANK = 64  # tuiprof_functions.MAX_FUNCTIONS
MAX_NAME = 200  # tuiprof_functions.MAX_NAME
MAX_RECENT_CALLS = 32  # tuiprof_functions.RECENT_CALLS
MAX_PROBLEM = 600  # characters of one of a request's problem lines
STALE_AFTER_S = 5.0  # the hook publishes every second: past this its rates are not today's
NO_FUNCTIONS = ("no timed Python functions: none of the names (tuiprof run --time-functions, TUIPROF_TIME_FUNCTIONS, "
                "XPU_TIMER_HOST_TRACING_FUNC, the built-in list) was found in this rank yet, or it is not a Python "
                "job started by tuiprof run")
NOT_ANSWERED = ("written beside the rank's segment; the rank has not applied it yet (it reads requests once a "
                "second while its startup hook runs: a job not started with tuiprof run never does)")
FIRST_PUBLICATION = "the rank's first publication of its function timings: rates need two"
NEW_FUNCTION = "the function was first timed in the rank's newest publication: rates need two"


class MalformedFunctionsError(ValueError):
    """The functions file does not say what the startup hook writes."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """The rank's answer to the last request it applied."""

    serial: int
    problems: list[str]


@dataclasses.dataclass(frozen=True)
class Publication:
    """One version of the file: when the rank wrote it, each function's (calls, ns, max ns) and newest
    calls ((start unix ns, duration ns)), the names waiting for their module, the last request's answer."""

    written_ns: int
    totals: dict[str, tuple[int, int, int]]
    left_out: int  # functions past MAX_FUNCTIONS_PER_RANK
    recent: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    waiting: list[str] = dataclasses.field(default_factory=list)
    answer: Answer | None = None


def parse(text: str) -> Publication:
    """The file's text checked and bounded; MalformedFunctionsError says what is wrong."""
    try:
        doc = json.loads(text)
        written_ns = _count(doc["written_ns"])
        entries = doc["functions"]
        if not isinstance(entries, list):
            raise TypeError("functions is not a list")
        totals: dict[str, tuple[int, int, int]] = {}
        recent: dict[str, list[tuple[int, int]]] = {}
        for entry in entries[:MAX_FUNCTIONS_PER_RANK]:
            name = printable(str(entry["name"]))[:MAX_NAME]
            totals[name] = (_count(entry["calls"]), _count(entry["ns"]), _count(entry["max_ns"]))
            recent[name] = [(_count(start), _count(duration))
                            for start, duration in entry.get("recent", [])[:MAX_RECENT_CALLS]]
        waiting = [printable(str(name))[:MAX_NAME] for name in doc.get("waiting", [])[:MAX_FUNCTIONS_PER_RANK]]
        request = doc.get("request")
        answer = None if request is None else Answer(_count(request["serial"]), [
            printable(str(line))[:MAX_PROBLEM] for line in request["problems"][:2 * MAX_FUNCTIONS_PER_RANK]])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise MalformedFunctionsError(f"the function timings file is malformed: {exc!r}") from exc
    return Publication(written_ns, totals, max(0, len(entries) - MAX_FUNCTIONS_PER_RANK), recent, waiting, answer)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"{value!r} is not a count")
    return value


class FunctionTimings:
    """One rank's functions file and its two newest publications."""

    def __init__(self, segment_path: str) -> None:
        self.file = SidecarFile(segment_path, FUNCTIONS_SUFFIX)
        self._text = ""
        self._newest: Publication | None = None
        self._before: Publication | None = None
        self._problem = ""
        self.sent: FunctionRequest | None = None  # the last request written to the rank

    def fill(self, stats: pb.RankStats, now_ns: int, listed: Container[str]) -> None:
        """``stats.functions`` from the newest publication, rates over the span since the one before;
        the last request's outcome (settling its caller's wait once the rank answered it). ``listed``: the
        side files its folder's listing holds (``SidecarFile.refresh``)."""
        text = self.file.refresh(listed)
        if text is not self._text:
            self._text = text
            self._take(text)
        newest = self._newest
        if newest is not None:
            stats.functions_waiting.extend(newest.waiting)
        self._fill_request(stats, newest)
        if self._problem or newest is None or not newest.totals:
            stats.unavailable["functions"] = self._problem or NO_FUNCTIONS
            return
        if newest.left_out:
            stats.unavailable["functions"] = (f"{newest.left_out} more functions in the rank's file are left out: "
                                              f"the agent takes at most {MAX_FUNCTIONS_PER_RANK} per rank")
        age_s = (now_ns - newest.written_ns) * 1e-9
        no_rates = (FIRST_PUBLICATION if self._before is None else
                    f"the rank last published its function timings {age_s:.0f} s ago (it does every second): "
                    "it is stopped, busy without the GIL, or exited" if age_s > STALE_AFTER_S else "")
        for name, (calls, ns, max_ns) in newest.totals.items():
            timing = stats.functions.add(name=name, calls_total=calls, seconds_total=ns * 1e-9,
                                         max_seconds=max_ns * 1e-9)
            _rates(timing, calls, ns, newest.written_ns, self._before, no_rates)

    def _fill_request(self, stats: pb.RankStats, newest: Publication | None) -> None:
        answer = newest.answer if newest is not None else None
        sent = self.sent
        if sent is not None and (answer is None or answer.serial != sent.serial):
            stats.function_request.CopyFrom(pb.FunctionTimingOutcome(serial=sent.serial, reason=NOT_ANSWERED))
        elif answer is not None:
            outcome = pb.FunctionTimingOutcome(serial=answer.serial, acknowledged=True, problems=answer.problems)
            stats.function_request.CopyFrom(outcome)
            if sent is not None and not sent.answered.done():
                sent.answered.set_result(outcome)

    def _take(self, text: str) -> None:
        if not text:
            self._problem, self._newest, self._before = "", None, None
            return
        try:
            publication = parse(text)
        except MalformedFunctionsError as exc:
            self._problem = str(exc)
            return
        self._problem = ""
        if self._newest is None or publication.written_ns > self._newest.written_ns:
            self._before, self._newest = self._newest, publication
        elif publication.written_ns < self._newest.written_ns:  # a new process's timer, or a clock step back
            self._before, self._newest = None, publication


def _rates(timing: pb.FunctionTiming, calls: int, ns: int, written_ns: int, before: Publication | None,
           no_rates: str) -> None:
    previous = before.totals.get(timing.name) if before is not None else None
    if no_rates or before is None or previous is None:
        why = no_rates or NEW_FUNCTION
    elif calls < previous[0] or ns < previous[1]:
        why = "the function's totals went down since the previous publication (its timer started over)"
    else:
        span_s = (written_ns - before.written_ns) * 1e-9
        timing.calls_per_s = (calls - previous[0]) / span_s
        timing.seconds_per_s = (ns - previous[1]) * 1e-9 / span_s
        return
    timing.unavailable["calls_per_s"] = timing.unavailable["seconds_per_s"] = why


def without_rates(stats: pb.RankStats, reason: str) -> None:
    """A rank not read this interval: its functions' totals stand, their rates are not this interval's."""
    for timing in stats.functions:
        timing.ClearField("calls_per_s")
        timing.ClearField("seconds_per_s")
        timing.unavailable["calls_per_s"] = timing.unavailable["seconds_per_s"] = reason
