"""Training-step, GC-pause, DataLoader-wait and crash recording for `tuiprof run`.

Self-contained on purpose: the job's Python need not have tuiprof installed.
It talks to libtuiprof_hook.so (path in ``TUIPROF_HOOK_LIBRARY``) through
ctypes. Nothing happens until the job imports torch: then it registers
PyTorch's global optimizer post-step hook (one step per ``optimizer.step()``),
a ``gc.callbacks`` entry, a timing wrapper around DataLoader iteration, and
``sys.excepthook`` / ``threading.excepthook`` wrappers that write an uncaught
exception's traceback beside the process's segment (for the agent, which
outlives the process) before handing it to the hook they replaced; a
``torch.cuda.OutOfMemoryError`` among them carries PyTorch's caching allocator
figures at the time. Those figures (``torch.cuda.memory_stats()``: host-side
counters, no device sync) go into the segment at optimizer steps too, at most
once a second and only once torch.cuda is initialized. Once
torch.distributed is up (seen at an optimizer step), ``tuiprof_flight``
publishes PyTorch Flight Recorder progress beside the segment too, and
``tuiprof_functions`` times the Python functions the environment names.
No ``sys.setprofile`` (it would collide with torch.profiler). Any failure
leaves the job untouched (logged at debug level), because telemetry must
never break training.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import pickle
import stat
import sys
import time
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # names for annotations only: nothing more is imported into the job at start
    import threading
    from collections.abc import Callable, Sequence

    SysExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]
    ThreadExceptHook = Callable[[threading.ExceptHookArgs], object]

LIBRARY_ENV = "TUIPROF_HOOK_LIBRARY"
_installed = False  # install() ran in this process
EXCEPTION_TEXT_LIMIT = 64 * 1024  # characters kept, from the end (where the exception itself is)
log = logging.getLogger("tuiprof.startup")


def _load_library() -> ctypes.CDLL | None:
    path = os.environ.get(LIBRARY_ENV)
    if not path:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        log.debug("tuiprof hook library %s not loadable: %s", path, exc)
        return None
    lib.tuiprof_record_step.restype = ctypes.c_int
    lib.tuiprof_record_step.argtypes = []
    for name in ("tuiprof_record_gc", "tuiprof_record_dataloader"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    for name in ("tuiprof_exception_path", "tuiprof_flight_path"):
        getattr(lib, name).restype = ctypes.c_char_p
        getattr(lib, name).argtypes = []
    lib.tuiprof_record_allocator.restype = ctypes.c_int
    lib.tuiprof_record_allocator.argtypes = [ctypes.c_uint32] + [ctypes.c_uint64] * len(ALLOCATOR_FIGURES)
    return lib


class NotOwnFileError(OSError):
    """Something other than this user's regular file is at a sidecar's path (left alone)."""


def _write_whole(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (the agent reads whole files only).

    The directory is every user's (/dev/shm), so nothing there is trusted: whatever
    is at ``path`` must be this user's own regular file, else NotOwnFileError and it
    stays as it is; the text goes into a new file beside it, created O_EXCL under a
    random name (never someone else's file, never through a link), renamed over
    ``path`` (rename replaces the name, it follows no link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise NotOwnFileError(f"{path} is not a regular file of uid {os.getuid()}; left alone")
    partial = f"{path}.{os.urandom(6).hex()}.tmp"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
            out.write(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the error that matters is the one raised
            os.unlink(partial)
        raise


# tp_allocator_state (tuiprof_segment.h): what tuiprof_record_allocator is told.
ALLOCATOR_READ, ALLOCATOR_NO_CUDA, ALLOCATOR_UNINITIALIZED = 1, 2, 3
# torch.cuda.memory_stats() keys, in tuiprof_record_allocator's order.
ALLOCATOR_FIGURES = ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocated_bytes.all.peak",
                     "num_alloc_retries", "num_ooms")
ALLOCATOR_EVERY_NS = 1_000_000_000
_ALLOCATOR_MISSING = {
    ALLOCATOR_NO_CUDA: "this torch is a CPU build (torch.version.cuda is None)",
    ALLOCATOR_UNINITIALIZED: "torch.cuda is not initialized in this process",
}


def allocator_figures(torch: ModuleType) -> tuple[int, tuple[int, ...]]:
    """PyTorch's CUDA caching allocator figures of the current device (ALLOCATOR_FIGURES) with
    ALLOCATOR_READ, or the state that says why there are none (and no figures). Reads host-side
    counters only: never initializes CUDA, never synchronizes the device."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return ALLOCATOR_NO_CUDA, ()
    if not torch.cuda.is_initialized():
        return ALLOCATOR_UNINITIALIZED, ()
    stats = torch.cuda.memory_stats()
    return ALLOCATOR_READ, tuple(int(stats[key]) for key in ALLOCATOR_FIGURES)


class _AllocatorPublisher:
    """PyTorch's caching allocator figures into the segment (``tuiprof_record_allocator``), at most
    once every ALLOCATOR_EVERY_NS, and at an out-of-memory error; never raising."""

    def __init__(self, lib: ctypes.CDLL, torch: ModuleType) -> None:
        self._record = lib.tuiprof_record_allocator
        self._torch = torch
        self._last_ns: int | None = None
        self._no_cuda = False  # a CPU build: said once, it cannot change

    def at_step(self) -> None:
        now = time.monotonic_ns()
        if self._no_cuda or (self._last_ns is not None and now - self._last_ns < ALLOCATOR_EVERY_NS):
            return
        self._last_ns = now
        self.publish()

    def publish(self) -> tuple[int, tuple[int, ...]] | None:
        """Read and publish the figures now; what was read, None when reading failed."""
        try:
            state, figures = allocator_figures(self._torch)
            self._record(state, *(figures or (0,) * len(ALLOCATOR_FIGURES)))  # zeros mean nothing without READ
        except Exception:  # telemetry must never break the training step
            log.debug("tuiprof could not read PyTorch's caching allocator figures", exc_info=True)
            return None
        self._no_cuda = state == ALLOCATOR_NO_CUDA
        return state, figures

    def oom_report(self) -> str:
        """The allocator's figures now, as the lines an out-of-memory crash report ends with."""
        read = self.publish()
        if read is None:
            return "\nPyTorch CUDA caching allocator at the OOM: unavailable (reading it failed)\n"
        state, figures = read
        if state != ALLOCATOR_READ:
            return f"\nPyTorch CUDA caching allocator at the OOM: unavailable ({_ALLOCATOR_MISSING[state]})\n"
        allocated, reserved, peak, retries, ooms = figures
        return (f"\nPyTorch CUDA caching allocator at the OOM (current device): allocated {_gib(allocated)}, "
                f"reserved {_gib(reserved)}, peak allocated {_gib(peak)}, allocation retries {retries}, "
                f"OOMs {ooms}\n")


def _gib(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


class _StepRecorder:
    """PyTorch's optimizer post-step hook: one step into the segment, the caching allocator's
    figures (rate-limited), and, once torch.distributed is initialized (looked at each step until
    then), the Flight Recorder publisher."""

    def __init__(self, lib: ctypes.CDLL, allocator: _AllocatorPublisher) -> None:
        self._record = lib.tuiprof_record_step
        self._allocator = allocator
        self._flight_path = lib.tuiprof_flight_path
        self._flight_pending = True

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._record()
        self._allocator.at_step()
        if self._flight_pending:
            dist = sys.modules.get("torch.distributed")
            if dist is not None and dist.is_available() and dist.is_initialized():
                self._flight_pending = False
                self._start_flight()

    def _start_flight(self) -> None:
        try:
            import torch
            import tuiprof_flight

            c10d = torch._C._distributed_c10d
            dump = getattr(c10d, "_dump_fr_trace_json", None)
            path = self._flight_path().decode()
            if dump is not None and path:
                tuiprof_flight.FlightPublisher(dump, _entries_reader(c10d, dump), path, _write_whole).start()
        except Exception:  # telemetry must never break the training step
            log.debug("tuiprof Flight Recorder publisher not started", exc_info=True)


def _entries_reader(c10d: Any, dump: Any) -> Any:
    """The Flight Recorder's entries: from its pickle dump without stack traces where PyTorch has it
    (half the cost of the JSON dump, which always carries them), else from the JSON dump."""
    without_stacks = getattr(c10d, "_dump_fr_trace", None)
    if without_stacks is not None:
        return lambda: pickle.loads(without_stacks(True, False, False)).get("entries", [])
    return lambda: json.loads(dump(True, True)).get("entries", [])


class _ExceptionRecorder:
    """Writes the last uncaught exception where the agent finds it, never raising; an out-of-memory
    error with the caching allocator's figures at the time."""

    def __init__(self, lib: ctypes.CDLL, allocator: _AllocatorPublisher, torch: ModuleType) -> None:
        import traceback  # here, not at startup: torch has imported it already

        self._path = lib.tuiprof_exception_path
        self._format = traceback.format_exception
        self._allocator = allocator
        self._out_of_memory = getattr(torch.cuda, "OutOfMemoryError", None)

    def record(self, exc_type: type[BaseException], exc_value: BaseException | None, exc_tb: TracebackType | None,
               thread_name: str | None = None) -> None:
        try:
            path = self._path().decode()
            if not path:
                return  # not a rank (no step, GEMM or collective yet): the agent does not follow it
            text = "".join(self._format(exc_type, exc_value, exc_tb))
            if self._out_of_memory is not None and issubclass(exc_type, self._out_of_memory):
                text += self._allocator.oom_report()  # at the end: kept when the text is cut from the front
            if thread_name is not None:
                text = f"Exception in thread {thread_name}:\n{text}"
            if len(text) > EXCEPTION_TEXT_LIMIT:
                cut = len(text) - EXCEPTION_TEXT_LIMIT
                text = f"[{cut} characters cut]\n{text[cut:]}"
            _write_whole(path, text)
        except Exception:  # a crash report must never change how the program ends
            log.debug("tuiprof could not record an uncaught exception", exc_info=True)

    def sys_hook(self, previous: SysExceptHook) -> SysExceptHook:
        def excepthook(exc_type: type[BaseException], exc_value: BaseException, exc_tb: TracebackType | None) -> None:
            self.record(exc_type, exc_value, exc_tb)
            previous(exc_type, exc_value, exc_tb)

        excepthook.__wrapped__ = previous  # type: ignore[attr-defined]
        return excepthook

    def thread_hook(self, previous: ThreadExceptHook) -> ThreadExceptHook:
        def excepthook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is not SystemExit:  # threading ignores SystemExit in threads
                name = args.thread.name if args.thread is not None else "?"
                self.record(args.exc_type, args.exc_value, args.exc_traceback, name)
            previous(args)

        excepthook.__wrapped__ = previous  # type: ignore[attr-defined]
        return excepthook


class _GcTimer:
    """gc.callbacks entry: one GC pause = time from 'start' to 'stop'."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._record = lib.tuiprof_record_gc
        self._started = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.time_ns()
        elif self._started:
            self._record(self._started, time.time_ns())
            self._started = 0


def _wrap_dataloader(lib: ctypes.CDLL) -> None:
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    original = base.__next__
    record = lib.tuiprof_record_dataloader

    def __next__(self: Any) -> Any:
        start = time.time_ns()
        try:
            return original(self)
        finally:
            record(start, time.time_ns())

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(base, "__next__", __next__)  # noqa: B010 -- a method of a torch class (mypy: no method assignment)


def _on_torch_imported(torch: ModuleType) -> None:
    lib = _load_library()
    if lib is None:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    allocator = _AllocatorPublisher(lib, torch)
    register_optimizer_step_post_hook(_StepRecorder(lib, allocator))
    gc.callbacks.append(_GcTimer(lib))
    _wrap_dataloader(lib)
    import threading  # torch has imported it already

    recorder = _ExceptionRecorder(lib, allocator, torch)
    sys.excepthook = recorder.sys_hook(sys.excepthook)
    threading.excepthook = recorder.thread_hook(threading.excepthook)


class _AfterExec(importlib.abc.Loader):
    """Delegating loader that runs a callback once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception:  # telemetry must never break the job's import of torch
            log.debug("tuiprof startup hook failed", exc_info=True)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Waits for `import torch` (without importing it) and hooks in after it."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _AfterExec(spec.loader, _on_torch_imported)
        return spec


def _segment_path_reader() -> Any:
    """This process's segment path as the hook library gives it ("" until it has one); None without the library."""
    lib = _load_library()
    if lib is None:
        return None
    path = lib.tuiprof_segment_path
    path.restype = ctypes.c_char_p
    path.argtypes = []
    return lambda: path().decode()


def install() -> None:
    """Arm the lazy torch hook and the timing of named functions (``tuiprof_functions``); once."""
    global _installed
    if _installed:
        return
    _installed = True
    if "torch" in sys.modules:
        _on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatcher())
    try:
        import tuiprof_functions

        tuiprof_functions.install(_segment_path_reader, _write_whole, _AfterExec)
    except Exception:  # telemetry must never stop the job from starting
        log.debug("tuiprof function timing not installed", exc_info=True)


def chain_sitecustomize(own_file: str) -> None:
    """Run the next ``sitecustomize`` on sys.path after ours, if there is one."""
    own_dir = os.path.dirname(os.path.abspath(own_file))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != own_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_tuiprof_chained_sitecustomize"] = module
    spec.loader.exec_module(module)
