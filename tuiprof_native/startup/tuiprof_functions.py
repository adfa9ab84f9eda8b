"""Named Python functions timed with no change to the job's code (xpu-timer's XPU_TIMER_HOST_TRACING_FUNC).

Names come from ``TUIPROF_TIME_FUNCTIONS`` (``tuiprof run --time-functions``) and from xpu-timer's own
``XPU_TIMER_HOST_TRACING_FUNC``, several separated by commas, each in xpu-timer's syntax
(``module@function``, ``module@Class@function``; ``__main__@function`` for a function of the entry
file) or dotted (``module:Class.function``); plus ``DEFAULT_NAMES`` (xpu-timer's built-in list) unless
``TUIPROF_TIME_FUNCTIONS_DEFAULTS=0``. A function is found when its module has been imported (a meta
path finder runs the look-up right after the module's code; modules already imported are looked up at
once), and timed from then on:

- on Python >= 3.12 through ``sys.monitoring`` (PY_START and PY_RETURN on the function's code object,
  PY_UNWIND for calls that raise), under a tool id of its own, so torch.profiler's Python tracing and
  debuggers keep theirs; a function without a code object (C) is wrapped as below;
- before 3.12 the attribute is replaced by a wrapper (``functools.wraps``): calls through the module or
  class attribute are timed, a reference taken before the look-up (``from m import f`` earlier) is not.
  Functions of the entry file are wrapped as their ``def`` runs: the entry file's top-level code is
  traced (``sys.settrace``, its own frame's lines only) from its start until the last one named is
  defined, found through the ``exec`` audit event that hands over its code (``python FILE`` and
  ``python -c``).

Per function: calls, total and longest time in ns (``time.perf_counter_ns``), counted as a call
returns or raises; a recursive function's inner calls count too, their time inside the outer one's;
and its newest ``RECENT_CALLS`` calls (start and end), for timeline dumps. The totals go, once a
second, to ``<segment>.functions`` beside the rank's segment (JSON, replaced whole):
``{"written_ns": <time.time_ns()>, "functions": [{"name": "torch:cuda.synchronize", "calls": 3,
"ns": 1200, "max_ns": 800, "recent": [[<start, time.time_ns() clock>, <duration ns>], ...]}],
"waiting": ["m:f"], "request": {"serial": 7, "problems": ["cannot time m:g: ..."]}}``, at most
``MAX_FUNCTIONS`` functions; ``waiting``: names the user gave whose module is not imported yet.
A name that cannot be timed gets one line on stderr (the others are timed); nothing here ever raises
into the job.

**Switched at run time** (agentd's SetFunctionTiming): the agent writes ``<segment>.functions-request``
(``{"serial": <n>, "start": [names], "stop": [names]}``) and the publisher thread, waking once a second,
applies it when its serial is new: stops first (a wrapper's attribute is restored; a code object is no
longer monitored; a name waiting for its module is forgotten), then starts (looked up now, or when its
module is imported). It answers in the next publication: the serial and one line per name it could not
start or stop. The folder is every user's, so a request is read only when it is a regular file (opened
without following a link, without blocking), owned by root or this process's user, writable by no one
else, and at most ``MAX_REQUEST_BYTES``; any other file there is left alone.
"""

from __future__ import annotations

import collections
import functools
import importlib.abc
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from types import CodeType, ModuleType
from typing import Any, NamedTuple

NAMES_ENV = "TUIPROF_TIME_FUNCTIONS"
XPU_TIMER_ENV = "XPU_TIMER_HOST_TRACING_FUNC"
DEFAULTS_ENV = "TUIPROF_TIME_FUNCTIONS_DEFAULTS"  # "0": the built-in list is off
SUFFIX = ".functions"  # agentd.collectors.rank_functions.FUNCTIONS_SUFFIX reads it
REQUEST_SUFFIX = ".functions-request"  # agentd.collectors.rank_function_requests writes it
MAX_REQUEST_BYTES = 16 * 1024
RECENT_CALLS = 32  # per function, for timeline dumps: 64 functions' fill about 70 KB of the file at most
MAX_FUNCTIONS = 64
MAX_NAME = 200
PUBLISH_EVERY_S = 1.0
MAIN = "__main__"
# xpu-timer's built-in list. Each is called at most a few times per step and does milliseconds of work
# (a DataLoader batch, a device sync, a backward pass), so the cost of timing it (bench/native/
# function_timing_cost.md: under a microsecond a call) is lost in it.
DEFAULT_NAMES = (
    "torch.utils.data.dataloader@_BaseDataLoaderIter@__next__",
    "torch@cuda@synchronize",
    "torch.cuda@Event@synchronize",
    "torch.cuda@Event@wait",
    "torch.cuda@Stream@synchronize",
    "torch.cuda@Stream@wait_event",
    "torch.cuda@Stream@wait_stream",
    "torch@autograd@backward",
    "torch@autograd@grad",
    "megatron.core.pipeline_parallel@schedules@forward_step",
    "megatron.core.pipeline_parallel@schedules@backward_step",
)
_NOT_PLAIN_CALLS = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR
_HOW_TO_NAME = "name a function as module@function, module@Class@function or module:Class.function"
log = logging.getLogger("tuiprof.startup")


class Target(NamedTuple):
    """A function to time: its module, the attributes from the module down to it, and the name it
    is shown by (``module:Class.function``, also for a target found in a submodule it led to)."""

    module: str
    path: tuple[str, ...]
    named_by_user: bool = True
    shown_as: str = ""

    @property
    def name(self) -> str:
        return self.shown_as or f"{self.module}:{'.'.join(self.path)}"


class Timing:
    """One function's totals and newest calls, updated by its timer on every call (under the GIL), and
    how to stop timing it."""

    __slots__ = ("name", "calls", "ns", "max_ns", "recent", "stop")

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.ns = 0
        self.max_ns = 0
        self.recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=RECENT_CALLS)  # perf_counter ns
        self.stop: Callable[[], None] = lambda: None  # raises NotTimedError when it cannot

    def add(self, start: int, end: int) -> None:
        elapsed = end - start
        self.calls += 1
        self.ns += elapsed
        if elapsed > self.max_ns:
            self.max_ns = elapsed
        self.recent.append((start, end))


def parse_names(text: str, named_by_user: bool = True) -> tuple[list[Target], list[str]]:
    """The targets ``text`` names (comma-separated), and one problem line per name that is not one."""
    targets: list[Target] = []
    problems: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if len(item) > MAX_NAME:
            problems.append(f"cannot time {item[:40]!r}...: longer than {MAX_NAME} characters")
            continue
        if ":" in item:
            module, _, rest = item.partition(":")
            path = rest.split(".")
        elif "@" in item:
            module, *parts = item.split("@")
            path = [name for part in parts for name in part.split(".")]
        else:
            problems.append(f"cannot time {item!r}: no module given; {_HOW_TO_NAME}")
            continue
        if not path or not all(name.isidentifier() for name in [*module.split("."), *path]):
            problems.append(f"cannot time {item!r}: not a Python name; {_HOW_TO_NAME}")
            continue
        targets.append(Target(module, tuple(path), named_by_user))
    return targets, problems


def names_from_environment(env: Mapping[str, str]) -> tuple[list[Target], list[str]]:
    """Every target the environment names (the user's first, then the defaults), each once, at most
    MAX_FUNCTIONS; the problems to print."""
    targets: list[Target] = []
    problems: list[str] = []
    for variable in (NAMES_ENV, XPU_TIMER_ENV):
        found, wrong = parse_names(env.get(variable, ""))
        targets += found
        problems += [f"{variable}: {line}; the other functions are timed" for line in wrong]
    if env.get(DEFAULTS_ENV, "1") != "0":
        targets += parse_names(",".join(DEFAULT_NAMES), named_by_user=False)[0]
    first: dict[str, Target] = {}
    for target in targets:
        first.setdefault(target.name, target)  # the user's spelling before a default's
    unique = list(first.values())
    if len(unique) > MAX_FUNCTIONS:
        left_out = [target.name for target in unique[MAX_FUNCTIONS:]]
        problems.append(f"at most {MAX_FUNCTIONS} functions are timed; not timed: {', '.join(left_out)}")
        unique = unique[:MAX_FUNCTIONS]
    return unique, problems


class NotTimedError(Exception):
    """A named function that cannot be timed; the message says why."""


def _lookup(owner: Any, attribute: str) -> Any:
    """``owner.attribute`` as stored (a class's staticmethod as the staticmethod), not bound."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attribute in klass.__dict__:
                return klass.__dict__[attribute]
        raise AttributeError(attribute)
    return getattr(owner, attribute)


def _plain_function(stored: Any, name: str) -> Any:
    function = stored.__func__ if isinstance(stored, (staticmethod, classmethod)) else stored
    if not callable(function) or isinstance(function, type):
        raise NotTimedError(f"{name} is a {type(function).__name__}, not a function")
    code = getattr(function, "__code__", None)
    if isinstance(code, CodeType) and code.co_flags & _NOT_PLAIN_CALLS:
        raise NotTimedError(f"{name} is a generator or coroutine function: its calls return before its work is "
                            "done; name the function that iterates or awaits it")
    return function


def _wrapper(function: Any, timing: Timing) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            timing.add(start, clock())

    timed.__tuiprof_timing__ = timing  # type: ignore[attr-defined]
    return timed


class _Monitor:
    """sys.monitoring (Python >= 3.12) under a tool id of our own: the timed code objects' starts and ends."""

    def __init__(self) -> None:
        import threading

        monitoring = sys.monitoring  # type: ignore[attr-defined]
        free = [tool for tool in (4, 3, 5, 1, 0, 2) if monitoring.get_tool(tool) is None]
        if not free:
            raise NotTimedError("every sys.monitoring tool id is taken")
        self._tool = free[0]
        self._events = monitoring.events
        self._set_local = monitoring.set_local_events
        self._timings: dict[CodeType, Timing] = {}
        self._starts: dict[tuple[CodeType, int], list[int]] = {}  # (code, thread) -> its calls' starts
        self._clock = time.perf_counter_ns
        self._thread = threading.get_ident
        monitoring.use_tool_id(self._tool, "tuiprof")
        monitoring.register_callback(self._tool, self._events.PY_START, self._start)
        monitoring.register_callback(self._tool, self._events.PY_RETURN, self._end)
        monitoring.register_callback(self._tool, self._events.PY_UNWIND, self._end)
        monitoring.set_events(self._tool, self._events.PY_UNWIND)  # not a local event: each raising frame asks

    def add(self, code: CodeType, timing: Timing) -> None:
        self._timings[code] = timing
        self._set_local(self._tool, code, self._events.PY_START | self._events.PY_RETURN)
        timing.stop = lambda: self._remove(code)

    def timed(self, code: CodeType) -> bool:
        return code in self._timings

    def _remove(self, code: CodeType) -> None:
        self._set_local(self._tool, code, 0)
        del self._timings[code]
        for key in [key for key in self._starts if key[0] is code]:
            del self._starts[key]

    def _start(self, code: CodeType, offset: int) -> None:
        key = (code, self._thread())
        starts = self._starts.get(key)
        if starts is None:
            starts = self._starts[key] = []
        starts.append(self._clock())

    def _end(self, code: CodeType, offset: int, value: object) -> None:
        timing = self._timings.get(code)
        if timing is None:
            return
        starts = self._starts.get((code, self._thread()))
        if starts:  # none: a call already running when timing began
            timing.add(starts.pop(), self._clock())


Write = Callable[[str, str], None]  # tuiprof_startup._write_whole: replace a file of ours whole
AfterExec = Callable[[Any, Callable[[ModuleType], None]], Any]  # tuiprof_startup._AfterExec: a loader that calls back


class FunctionTimer:
    """Finds the targets as their modules are imported, times them, and publishes their totals."""

    def __init__(self, targets: list[Target], segment_path: Callable[[], Callable[[], str] | None],
                 write: Write, report: Callable[[str], None]) -> None:
        self._waiting: dict[str, list[Target]] = {}  # module name -> targets looked up once it is imported
        for target in targets:
            self._waiting.setdefault(target.module, []).append(target)
        self._segment_path = segment_path
        self._write = write
        self._report = report
        self._timings: list[Timing] = []
        self._monitor: _Monitor | None = None
        self._main_targets = self._waiting.pop(MAIN, [])
        self._main_code: CodeType | None = None
        self._main_pending: dict[str, Target] = {}
        self._publisher_started = False
        self._problems: list[str] | None = None  # while a request is applied: its problems, else printed
        self._request_seen: tuple[int, int, int] | None = None  # (inode, mtime ns, size) of the file last judged
        self._request_serial: int | None = None
        self._answer: dict[str, Any] | None = None  # the last request's serial and problems

    def install(self, after_exec: AfterExec) -> None:
        """Look up the targets of modules already imported and watch for the others' imports."""
        if self._main_targets:
            sys.addaudithook(self._audit)
        for module in [name for name in self._waiting if name in sys.modules]:
            self.module_imported(sys.modules[module])
        sys.meta_path.insert(0, _ImportWatcher(self, after_exec))
        self._start_publisher()  # also when nothing is timed yet: it reads the agent's requests

    def waits_for(self, module: str) -> bool:
        return module in self._waiting

    def module_imported(self, module: ModuleType) -> None:
        for target in self._waiting.pop(module.__name__, []):
            self._find(target, module)

    # -------------------------------------------------------------- finding and timing

    def _find(self, target: Target, root: Any) -> None:
        owner = root
        for depth, attribute in enumerate(target.path[:-1]):
            try:
                owner = getattr(owner, attribute)
            except AttributeError:
                if isinstance(owner, ModuleType):  # perhaps a submodule not imported yet: looked up with it
                    rest = Target(f"{owner.__name__}.{attribute}", target.path[depth + 1:], target.named_by_user,
                                  target.name)
                    self._waiting.setdefault(rest.module, []).append(rest)
                    return
                self._problem(target, f"{'.'.join(target.path[:depth + 1])} has no attribute {attribute!r}")
                return
        self._time(target, owner, target.path[-1])

    def _time(self, target: Target, owner: Any, attribute: str) -> None:
        try:
            stored = _lookup(owner, attribute)
        except AttributeError:
            where = owner.__name__ if isinstance(owner, (ModuleType, type)) else target.name.rpartition(".")[0]
            self._problem(target, f"{where} has no attribute {attribute!r}")
            return
        if getattr(stored, "__tuiprof_timing__", None) is not None:
            return  # named twice (two spellings of one function): timed once
        try:
            function = _plain_function(stored, target.name)
            timing = Timing(target.name)
            code = getattr(function, "__code__", None)
            if sys.version_info >= (3, 12) and isinstance(code, CodeType):
                if self._monitored().timed(code):
                    return
                self._monitored().add(code, timing)
            else:
                timed = _wrapper(function, timing)
                replacement = type(stored)(timed) if stored is not function else timed
                setattr(owner, attribute, replacement)
                timing.stop = _restorer(owner, attribute, stored, replacement, target.name)
        except (NotTimedError, TypeError, AttributeError) as exc:  # a read-only attribute (a C type's)
            self._problem(target, str(exc))
            return
        self._timings.append(timing)

    def _monitored(self) -> _Monitor:
        if self._monitor is None:
            self._monitor = _Monitor()
        return self._monitor

    def _problem(self, target: Target, why: str) -> None:
        if self._problems is not None:
            self._problems.append(f"cannot time {target.name}: {why}")
        elif target.named_by_user:
            self._report(f"cannot time {target.name}: {why}; the other functions are timed")
        else:
            log.debug("tuiprof default function %s not timed: %s", target.name, why)

    # -------------------------------------------------------------- switched at run time

    def apply_request(self, serial: int, start: list[str], stop: list[str]) -> list[str]:
        """Stop, then start timing the functions named; one problem line per name that could not be."""
        problems: list[str] = []
        self._problems = problems
        try:
            for text in stop:
                targets, wrong = parse_names(text)
                problems += wrong
                for target in targets:
                    self._stop(target)
            for text in start:
                targets, wrong = parse_names(text)
                problems += wrong
                for target in targets:
                    self._start(target)
        finally:
            self._problems = None
        self._request_serial = serial
        self._answer = {"serial": serial, "problems": problems}
        return problems

    def _start(self, target: Target) -> None:
        if target.name in {timing.name for timing in self._timings} | set(self._waiting_names()):
            return  # timed already, or waiting for its module
        if len(self._timings) + sum(map(len, self._waiting.values())) >= MAX_FUNCTIONS:
            self._problem(target, f"{MAX_FUNCTIONS} functions are timed or waiting already; stop one first")
        elif target.module in sys.modules:
            self._find(target, sys.modules[target.module])
        else:
            self._waiting.setdefault(target.module, []).append(target)

    def _stop(self, target: Target) -> None:
        waiting = [(module, t) for module, targets in self._waiting.items() for t in targets if t.name == target.name]
        waiting += [(MAIN, t) for t in self._main_pending.values() if t.name == target.name]
        timed = [timing for timing in self._timings if timing.name == target.name]
        for module, found in waiting:
            if module == MAIN and found in self._main_pending.values():
                del self._main_pending[".".join(found.path)]
            else:
                self._waiting[module].remove(found)
        for timing in timed:
            try:
                timing.stop()
            except NotTimedError as exc:
                self._problems_or_report(f"cannot stop timing {target.name}: {exc}")
                continue
            self._timings.remove(timing)
        if not waiting and not timed:
            self._problems_or_report(f"cannot stop timing {target.name}: it is not timed in this process")

    def _problems_or_report(self, line: str) -> None:
        if self._problems is not None:
            self._problems.append(line)
        else:
            self._report(line)

    def read_request(self, path: str) -> None:
        """Apply the agent's request at ``path`` when it is new and may be believed (see the module's
        docstring); anything else there is left alone."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:  # ELOOP: a link; EACCES: another user's
            log.debug("tuiprof function timing request %s not read: %s", path, exc)
            return
        try:
            st = os.fstat(fd)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._request_seen:
                return
            self._request_seen = seen
            if (not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022
                    or st.st_size > MAX_REQUEST_BYTES):
                log.debug("tuiprof function timing request %s ignored: not a regular file of root or uid %d, "
                          "writable by no one else, of at most %d bytes", path, os.getuid(), MAX_REQUEST_BYTES)
                return
            text = os.read(fd, MAX_REQUEST_BYTES + 1)
        finally:
            os.close(fd)
        try:
            request = json.loads(text)
            serial, start, stop = request["serial"], request.get("start", []), request.get("stop", [])
            if not isinstance(serial, int) or not all(
                    isinstance(names, list) and len(names) <= MAX_FUNCTIONS and all(isinstance(n, str) for n in names)
                    for names in (start, stop)):
                raise TypeError(f"a request is {{serial: int, start: [names], stop: [names]}}, at most "
                                f"{MAX_FUNCTIONS} names each, not {text[:100]!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            log.debug("tuiprof function timing request %s malformed: %r", path, exc)
            return
        if serial != self._request_serial:
            self.apply_request(serial, start, stop)

    # -------------------------------------------------------------- the entry file

    def _audit(self, event: str, args: tuple) -> None:
        """The audit hook: sees the entry file's code just before it runs. An audit hook that raises
        fails the operation audited, so nothing leaves it."""
        if event != "exec" or self._main_code is not None:
            return
        try:
            self._entry_file(args[0])
        except Exception:
            log.debug("tuiprof could not look up the entry file's functions", exc_info=True)

    def _entry_file(self, code: object) -> None:
        if not isinstance(code, CodeType) or code.co_name != "<module>" or not _is_entry_file(code.co_filename):
            return
        self._main_code = code
        defined = _qualnames(code)
        for target in self._main_targets:
            qualname = ".".join(target.path)
            if qualname not in defined:
                self._problem(target, f"the entry file {code.co_filename} defines no function {qualname}")
            elif sys.version_info >= (3, 12):
                self._time_main_code(target, defined[qualname])
            else:
                self._main_pending[qualname] = target
        if not self._main_pending:
            return
        if sys.gettrace() is not None:
            for target in self._main_pending.values():
                self._problem(target, "a tracer (debugger, coverage) runs, and before Python 3.12 the entry "
                                      "file's functions are found with a tracer of our own")
            self._main_pending.clear()
        else:
            sys.settrace(self._entry_call)

    def _time_main_code(self, target: Target, code: CodeType) -> None:
        if code.co_flags & _NOT_PLAIN_CALLS:
            self._problem(target, f"{target.name} is a generator or coroutine function: its calls return before "
                                  "its work is done; name the function that iterates or awaits it")
            return
        timing = Timing(target.name)
        try:
            self._monitored().add(code, timing)
        except NotTimedError as exc:
            self._problem(target, str(exc))
            return
        self._timings.append(timing)

    def _entry_call(self, frame: Any, event: str, arg: Any) -> Any:
        return self._entry_line if frame.f_code is self._main_code else None

    def _entry_line(self, frame: Any, event: str, arg: Any) -> Any:
        """Each line of the entry file's top level: wrap the functions defined by then. (What a trace
        function raises would reach the job: nothing leaves it.)"""
        try:
            namespace = frame.f_globals
            for qualname, target in list(self._main_pending.items()):
                head = namespace.get(target.path[0])
                if head is not None and _defines(head, target.path[1:]):
                    del self._main_pending[qualname]
                    self._find(target, _Namespace(namespace))
        except Exception:
            log.debug("tuiprof could not wrap the entry file's functions", exc_info=True)
            self._main_pending.clear()
        if event == "return" or not self._main_pending:
            sys.settrace(None)
            frame.f_trace = None
            return None
        return self._entry_line

    # -------------------------------------------------------------- publishing

    def _start_publisher(self) -> None:
        if not self._publisher_started:
            import threading

            self._publisher_started = True
            threading.Thread(target=self._publish_forever, name="tuiprof-functions", daemon=True).start()

    def _publish_forever(self) -> None:
        try:
            path_of = self._segment_path()
            if path_of is None:
                return  # no hook library: nowhere to publish
            while True:
                time.sleep(PUBLISH_EVERY_S)
                segment = path_of()
                if not segment:
                    continue
                self.read_request(segment + REQUEST_SUFFIX)
                if self._timings or self._answer is not None or self._waiting_names():
                    self._write(segment + SUFFIX, self.document())
        except Exception:  # telemetry never breaks the job (NotOwnFileError: someone else's file is there)
            log.debug("tuiprof function timing publisher stopped", exc_info=True)

    def _waiting_names(self) -> list[str]:
        return [t.name for targets in list(self._waiting.values()) for t in targets if t.named_by_user]

    def document(self) -> str:
        """What the file says now (calls' starts on the time.time_ns() clock)."""
        written_ns = time.time_ns()
        to_wall = written_ns - time.perf_counter_ns()
        document: dict[str, Any] = {"written_ns": written_ns, "functions": [
            {"name": t.name, "calls": t.calls, "ns": t.ns, "max_ns": t.max_ns,
             "recent": [[start + to_wall, end - start] for start, end in list(t.recent)]} for t in list(self._timings)]}
        waiting = self._waiting_names()
        if waiting:
            document["waiting"] = waiting
        if self._answer is not None:
            document["request"] = self._answer
        return json.dumps(document, separators=(",", ":"))


class _Namespace:
    """The entry file's globals as an object whose attributes are its names (what ``_find`` walks)."""

    def __init__(self, namespace: dict) -> None:
        object.__setattr__(self, "_namespace", namespace)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._namespace[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._namespace[name] = value


def _restorer(owner: Any, attribute: str, stored: Any, replacement: Any, name: str) -> Callable[[], None]:
    """How to put ``stored`` back where its timing wrapper ``replacement`` is (a class's inherited
    method: the subclass's attribute goes, so the base's shows again)."""
    own = not isinstance(owner, type) or attribute in owner.__dict__

    def restore() -> None:
        try:
            current = _lookup(owner, attribute)
        except AttributeError:
            current = None
        if current is not replacement:
            raise NotTimedError(f"{name} was replaced since its timing began (the job assigned it): left as it is")
        if own:
            setattr(owner, attribute, stored)
        else:
            delattr(owner, attribute)

    return restore


def _defines(head: Any, rest: tuple[str, ...]) -> bool:
    """Whether ``head`` (a global of the entry file) has ``rest`` below it by now."""
    for attribute in rest:
        try:
            head = _lookup(head, attribute)
        except AttributeError:
            return False
    return True


def _qualnames(code: CodeType) -> dict[str, CodeType]:
    """The functions (and methods) a module's code defines, by qualified name."""
    found: dict[str, CodeType] = {}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found[const.co_qualname] = const
            found.update(_qualnames(const))
    return found


def _is_entry_file(filename: str) -> bool:
    """Whether code compiled from ``filename`` is the program's entry file (``python FILE`` or ``-c``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-c":
        return filename == "<string>"
    return bool(argv0) and os.path.abspath(filename) == os.path.abspath(argv0)


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Hands a watched module to the timer right after its code ran (other modules: not involved)."""

    def __init__(self, timer: FunctionTimer, after_exec: AfterExec) -> None:
        self._timer = timer
        self._after_exec = after_exec
        self._finding: set[str] = set()  # names being looked up by the finders after this one

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name in self._finding or not self._timer.waits_for(name):
            return None
        self._finding.add(name)
        try:
            for finder in [f for f in sys.meta_path if f is not self]:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find else None
                if spec is not None:
                    if spec.loader is not None:
                        spec.loader = self._after_exec(spec.loader, self._timer.module_imported)
                    return spec
            return None
        finally:
            self._finding.discard(name)


def install(segment_path: Callable[[], Callable[[], str] | None], write: Write,
            after_exec: AfterExec) -> FunctionTimer:
    """Time the functions the environment names, and those the agent's requests name later. ``segment_path`` gives, once and off the job's
    thread, the reader of this process's segment path ("" until it has one; None: no hook library);
    ``write`` replaces a file whole; ``after_exec`` wraps a loader to call back once its module ran."""
    targets, problems = names_from_environment(os.environ)
    for line in problems:
        print(f"tuiprof: {line}", file=sys.stderr)
    global installed
    installed = FunctionTimer(targets, segment_path, write, lambda line: print(f"tuiprof: {line}", file=sys.stderr))
    installed.install(after_exec)
    return installed


installed: FunctionTimer | None = None  # this process's timer (its totals: ``installed.document()``)
