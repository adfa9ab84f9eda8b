"""CPU the console uses per second at a 1 s refresh, and where it goes (issue 14).

    .venv/bin/python bench/console/console_cpu_profile.py --seconds 30 --warmup 8 [--profile [--native] [--by-thread]] [--cprofile] [--only embedded,connect,replay,fake-gpu,nvitop]
    .venv/bin/python bench/console/console_cpu_profile.py --frames 300 [--source /tmp/before]   # in process, per frame
    # the same, running an older commit's code (before/after on the same machine and load):
    rm -rf /tmp/before && mkdir /tmp/before && git archive COMMIT | tar -x -C /tmp/before
    cp tuiprof_native/*.so /tmp/before/tuiprof_native/
    .venv/bin/python bench/console/console_cpu_profile.py --source /tmp/before

Three runs, one after the other, each in its own 200×60 pseudo-terminal drained as
fast as output comes (no emulator cost counted):

- ``embedded``: ``tuiprof --interval 1``, the console with its agent in its own
  process, watching this host (Enter opens the host's view, as bench/console/console_nvitop.py does);
- ``replay``: ``tuiprof replay --speed 1`` over tests/console/data/gpu-fixture-4hosts.ndjson
  (4 hosts × 8 GPUs) looped to last the run, Enter opening gpu-node-01's 8-GPU view:
  the console's drawing alone, with a busier screen than this GPU-less host gives;
- ``fake-gpu`` (not by default): ``tuiprof --interval 1`` as ``embedded``, its agent's GPU
  collector answered by the tests' ``FakeNvml`` (tests/agent/test_collectors_gpu_fake.py) as
  one H100 with two processes whose utilization, power, temperature, clock and SM shares
  change every second: the GPU host view's drawing on a machine without a GPU. NVML's own
  cost is not in it (the fake answers in microseconds); the GPU machine's run is
  bench/console/console_nvitop.sh's;
- ``connect``: ``tuiprof connect 127.0.0.1:PORT --interval 1`` to a separate
  ``agentd --interval-ms 1000``: the console's own cost and the agent's apart, in one
  window; the agent's /metrics is read every second for
  ``tuiprof_collector_duration_seconds`` (the wall time of each collector's latest
  collect()), averaged per collector;
- ``nvitop`` (not by default): ``nvitop --monitor full --interval 1`` from ``--nvitop-path``
  (a folder holding nvitop and its own nvidia-ml-py), measured and profiled the same way:
  the peer's split, on the same machine and load.

CPU is user + system time from ``/proc/<pid>/stat`` over the measured window, in
ms per wall second; the console's is also given per thread, with each thread's wakeups a
second (its voluntary context switches; on a VM each can cost tens of µs, bench/console/wakeup_cost.py)
(``/proc/<pid>/task``, each
named by ``py-spy dump``: the event loop's ``MainThread``, Textual's ``textual-input`` and
``textual-output``, gRPC's). With ``--profile`` each console run is then sampled by
``py-spy record`` (a second window, so py-spy's own cost is not counted above) and
the top functions by inclusive and own samples are printed (``--native``: with the C
functions under Python's, e.g. which libnvidia-ml call; ``--by-thread``: each thread's own); with ``--cprofile`` each
console is run once more with cProfile on in its event loop after the warm-up, and the
functions with the largest share of the loop's busy time are printed (exact call
counts and cumulative times where py-spy's samples are few).

``--frames N`` measures instead, in one process, headless (no terminal, no timers), the
replay's 8-GPU host view of gpu-node-01 given N new snapshots one after the other: the CPU
of the view's refresh (``render_views``) and of the compositor's repaint of what it changed,
per frame: the console's drawing without the noise of the rest of a second.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import pathlib
import pstats
import pty
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import urllib.request
from collections.abc import Callable

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
FIXTURE = REPO / "tests" / "console" / "data" / "gpu-fixture-4hosts.ndjson"
COLUMNS, LINES = 200, 60
TICKS = os.sysconf("SC_CLK_TCK")


def source_env(source: pathlib.Path) -> dict[str, str]:
    """The environment that makes this Python import tuiprof and agentd from ``source`` (ahead of
    the editable install of this checkout, and of what PYTHONPATH already names, such as a GPU
    machine's carried wheels), run with ``source`` as working directory."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(source), os.environ.get("PYTHONPATH"))))}


def tuiprof(*args: str) -> list[str]:
    """The console's command line, run by the Python running this script (the venv's, or a GPU machine's)."""
    return [sys.executable, "-m", "tuiprof.cli", *args]


def py_spy() -> str:
    """The venv's py-spy, else the one on PATH (a GPU machine's, installed from a carried wheel)."""
    return str(VENV_BIN / "py-spy") if (VENV_BIN / "py-spy").exists() else (shutil.which("py-spy") or "py-spy")


class PtyProgram:
    """A program in its own pseudo-terminal, its output drained and counted."""

    def __init__(self, argv: list[str], source: pathlib.Path, env: dict[str, str] | None = None) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        env = {**source_env(source), "TERM": "xterm-256color", "COLORTERM": "truecolor", **(env or {})}
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True, cwd=source)
        os.close(slave)
        self._master = master
        self.bytes_written = 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            select.select([self._master], [], [], 1.0)
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: the program closed its terminal
                return
            if not chunk:
                return
            self.bytes_written += len(chunk)

    def press_enter(self) -> None:
        os.write(self._master, b"\r")

    def press(self, keys: bytes) -> None:
        os.write(self._master, keys)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        os.close(self._master)


def thread_cpu_seconds(pid: int) -> dict[int, tuple[float, int]]:
    """User + system CPU seconds of each thread of ``pid`` so far, and how many times it went to
    sleep (its voluntary context switches: each one a wakeup later), by thread id."""
    threads = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            sleeps = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", (task / "status").read_text(), re.M)
            threads[int(task.name)] = (cpu_seconds(pid, task.name), int(sleeps[1]) if sleeps else 0)
        except (FileNotFoundError, ProcessLookupError):  # the thread ended
            pass
    return threads


def cpu_seconds(pid: int, thread: str | None = None) -> float:
    """User + system CPU seconds of one process (all its threads), or of one of its threads, so far."""
    stat = f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat"
    fields = pathlib.Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def thread_names(pid: int) -> dict[int, str]:
    """Each thread of ``pid`` by name: Python's (py-spy dump), else the kernel's (gRPC core's threads)."""
    names = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # the thread ended
            names[int(task.name)] = (task / "comm").read_text().strip()
    dump = subprocess.run([py_spy(), "dump", "--pid", str(pid)],
                          capture_output=True, text=True, check=False).stdout
    names.update((int(tid), name) for tid, name in re.findall(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump, re.M))
    return names


def measure_cpu(pids: dict[str, int], seconds: float, each_second: Callable[[], None] = lambda: None,
                threads_of: int | None = None) -> tuple[dict[str, float], dict[int, tuple[float, float]]]:
    """ms of CPU per wall second of each named process over ``seconds``, and of each thread of
    the process ``threads_of`` (by thread id) with its wakeups a second."""
    before, start = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
    threads_before = thread_cpu_seconds(threads_of) if threads_of else {}
    while time.monotonic() - start < seconds:
        time.sleep(1.0)
        each_second()
    wall = time.monotonic() - start
    threads_after = thread_cpu_seconds(threads_of) if threads_of else {}
    per_thread = {tid: ((used - threads_before.get(tid, (0.0, 0))[0]) / wall * 1000,
                        (sleeps - threads_before.get(tid, (0.0, 0))[1]) / wall)
                  for tid, (used, sleeps) in threads_after.items()}
    return {name: (cpu_seconds(pid) - before[name]) / wall * 1000 for name, pid in pids.items()}, per_thread


def looped_fixture(seconds: float) -> pathlib.Path:
    """The GPU fixture's first three seconds of snapshots repeated, one second apart, for ``seconds``."""
    lines = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    infos = [e for e in lines if e["event"] == "info"]
    snapshots = [e for e in lines if e["event"] == "snapshot"]
    first = min(e["t"] for e in snapshots)
    span = max(e["t"] for e in snapshots) - first + 1
    with tempfile.NamedTemporaryFile("w", suffix=".ndjson", prefix="tuiprof-replay-", delete=False) as out:
        for event in infos:
            out.write(json.dumps(event) + "\n")
        for loop in range(int(seconds // span) + 2):
            for event in snapshots:
                out.write(json.dumps({**event, "t": event["t"] + loop * span}) + "\n")
    return pathlib.Path(out.name)


# The C functions a thread waits in (sleeping, polling, on a lock): idle samples under --native.
WAITING = re.compile(r"(clock_nanosleep|__?nanosleep|epoll_wait|epoll_pwait|e?poll|ppoll|select|pselect6?"
                     r"|__?futex\w*|futex_wait\w*|pthread_cond_\w*wait\w*|sem_\w*wait\w*|syscall) ")


def profile(pid: int, seconds: float, top: int, rate: int, native: bool, by_thread: bool) -> str:
    """py-spy's samples of ``pid`` summed by function: inclusive and own, the ``top`` of each
    (``by_thread``: the own samples of each thread apart, by its name)."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as raw:
        # --native stops the process for each sample (py-spy cannot unwind C stacks otherwise)
        subprocess.run([py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                        "--rate", str(rate), "--format", "raw", "--output", raw.name,
                        *(["--native"] if native else ["--nonblocking"]), *(["--threads"] if by_thread else [])],
                       check=True, capture_output=True)
        inclusive: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        own_by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        total = 0
        for line in pathlib.Path(raw.name).read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            count = int(count_text)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            thread = re.sub(r"^thread \(\d+\): ", "", frames.pop(0)) if by_thread else ""
            if not frames or native and WAITING.match(frames[-1]):  # py-spy tells idle from busy only without --native
                continue
            total += count
            own[frames[-1]] += count
            own_by_thread[thread][frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    rows = [f"  py-spy: {total} samples at {rate} Hz over {seconds:.0f} s (all threads, idle excluded)"]
    for title, counter in (("inclusive", inclusive), ("own", own)):
        rows.append(f"  top {top} by {title} samples:")
        rows += [f"    {n / total * 100:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    if by_thread:
        for thread, counter in sorted(own_by_thread.items(), key=lambda kv: -sum(kv[1].values())):
            count = sum(counter.values())
            rows.append(f"  thread {thread}: {count / total * 100:.1f}% of the samples, "
                        f"{count / rate / seconds * 1000:.2f} ms/s; top {top // 2} by own samples:")
            rows += [f"    {n / count * 100:5.1f}%  {frame}" for frame, n in counter.most_common(top // 2)]
    return "\n".join(rows)


FAKE_GPU_CONSOLE = """
import dataclasses, random, subprocess, sys, time
sys.path.insert(0, sys.argv.pop(1))  # the tests' folder: the fake NVML
import pynvml
from agent import test_collectors_gpu_fake as fake
from agentd.collectors import gpu

processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(2)]

class LiveNvml(fake.FakeNvml):
    # NVML's clock is the wall clock, and the figures a GPU under load changes every second.
    now_us = property(lambda self: time.time_ns() // 1000, lambda self, value: None)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return pynvml.c_nvmlUtilization_t(gpu=random.randint(20, 40), memory=random.randint(5, 20))

    def nvmlDeviceGetPowerUsage(self, handle):
        return random.randint(150_000, 300_000)

    def nvmlDeviceGetTemperatureV(self, handle, sensor):
        return random.randint(40, 45)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return {pynvml.NVML_CLOCK_SM: random.choice([1755, 1980]), pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def _process_utilization(self, handle, buffer, count, last_seen):
        now = self.now_us
        self.gpus[handle].utilization_samples = [(now - 500_000 + i * 100_000, p.pid, random.randint(10, 40))
                                                 for i in range(5) for p in processes]
        return super()._process_utilization(handle, buffer, count, last_seen)

h100 = dataclasses.replace(fake.HOPPER, name=b"NVIDIA H100 80GB HBM3", memory_total=80 << 30,
                           processes=[(p.pid, 20 << 30) for p in processes])
gpu.pynvml = LiveNvml([h100])
from tuiprof.cli import main
sys.argv[0] = "tuiprof"
try:
    sys.exit(main())
finally:
    for p in processes:
        p.kill()
"""
"""``python -c`` this, then the tests' folder, then the console's arguments: ``fake-gpu``."""


EVENT_LOOP_PROFILER = """
import cProfile, os, sys
from tuiprof.tui.app import TuiprofApp
profiler = cProfile.Profile()
mounted, quitting = TuiprofApp.on_mount, TuiprofApp.action_quit
def on_mount(self):
    mounted(self)
    self.set_timer(float(os.environ["PROFILE_AFTER_S"]), lambda: profiler.enable())
async def action_quit(self):
    profiler.disable()
    profiler.dump_stats(os.environ["PROFILE_OUT"])
    await quitting(self)
TuiprofApp.on_mount, TuiprofApp.action_quit = on_mount, action_quit
from tuiprof.cli import main
sys.argv[0] = "tuiprof"
sys.exit(main())
"""
"""``python -c`` this, then the console's arguments: the console with cProfile on in the event
loop's thread from ``PROFILE_AFTER_S`` after start until q, written to ``PROFILE_OUT``."""


def profile_event_loop(argv: list[str], args: argparse.Namespace) -> str:
    """The console's event loop under cProfile over ``args.seconds`` after the warm-up (a run of
    its own): each function's cumulative time as a share of the loop's busy time (not waiting
    in epoll), the ``args.top`` largest. cProfile slows pure Python more than C: shares, not ms.
    ``argv`` is a ``tuiprof(...)`` command line: its console arguments follow ``-m tuiprof.cli``."""
    with tempfile.TemporaryDirectory(prefix="tuiprof-bench-") as temporary:
        out = pathlib.Path(temporary) / "loop.prof"
        program = PtyProgram([sys.executable, "-c", EVENT_LOOP_PROFILER, *argv[3:]], args.source,
                             {"PROFILE_AFTER_S": str(args.warmup), "PROFILE_OUT": str(out)})
        try:
            time.sleep(args.warmup / 2)
            program.press_enter()
            time.sleep(args.warmup / 2 + args.seconds)
            program.press(b"q")
            program.process.wait(30)
        finally:
            program.stop()
        entries = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    waiting = sum(own for (_, _, function), (_, _, own, _, _) in entries.items() if "epoll" in function)
    busy = sum(own for _, _, own, _, _ in entries.values()) - waiting
    ranked = sorted(((total, key) for key, (_, _, _, total, _) in entries.items() if total < 0.99 * busy),
                    reverse=True)
    own = sorted(((own, key) for key, (_, _, own, _, _) in entries.items() if "epoll" not in key[2]), reverse=True)
    rows = [f"  cProfile: event loop busy {busy:.2f} s (profiled) over {args.seconds:.0f} s; "
            f"top {args.top} by cumulative share of it:"]
    rows += [f"    {total / busy * 100:5.1f}%  {function} ({pathlib.Path(file).name}:{line})"
             for total, (file, line, function) in ranked[:args.top]]
    rows.append(f"  top {args.top} by own share:")
    rows += [f"    {total / busy * 100:5.1f}%  {function} ({pathlib.Path(file).name}:{line})"
             for total, (file, line, function) in own[:args.top]]
    return "\n".join(rows)


def run_console(name: str, argv: list[str], args: argparse.Namespace, agent: Agentd | None = None,
                env: dict[str, str] | None = None) -> None:
    """Measure the console running ``argv`` (and ``agent``, the separate agentd it watches, if any)."""
    program = PtyProgram(argv, args.source, env)
    try:
        time.sleep(args.warmup / 2)
        if name != "nvitop":  # tuiprof: Enter opens the host's view; nvitop shows its one screen
            program.press_enter()
        time.sleep(args.warmup / 2)
        if program.process.poll() is not None:
            raise SystemExit(f"{name}: the console exited ({program.process.returncode})")
        written = program.bytes_written
        pids = {"console": program.process.pid, **({"agentd": agent.process.pid} if agent else {})}
        used, per_thread = measure_cpu(pids, args.seconds, agent.sample if agent else lambda: None,
                                       threads_of=program.process.pid)
        rate = (program.bytes_written - written) / args.seconds
        print(f"{name}: console process {used['console']:.1f} ms CPU/s, {rate:.0f} B/s to the terminal "
              f"(over {args.seconds:.0f} s)", flush=True)
        names = thread_names(program.process.pid)
        busy = sorted(((ms, tid) for tid, (ms, _) in per_thread.items() if ms > 0), reverse=True)
        print(f"{name}: by thread: " + ", ".join(
            f"{names.get(tid, tid)} {ms:.2f}" for ms, tid in busy), flush=True)
        awake = sorted(((woken, tid) for tid, (_, woken) in per_thread.items() if woken > 0), reverse=True)
        print(f"{name}: wakeups a second, {sum(w for w, _ in awake):.1f} in all: " + ", ".join(
            f"{names.get(tid, tid)} {woken:.1f}" for woken, tid in awake), flush=True)
        if agent:
            print(f"{name}: agentd process {used['agentd']:.1f} ms CPU/s; each collector's collect() "
                  "wall time, mean of per-second readings:", flush=True)
            for collector, values in sorted(agent.durations.items(), key=lambda kv: -sum(kv[1])):
                print(f"    {collector:<12} {sum(values) / len(values) * 1000:7.2f} ms", flush=True)
        if args.profile:
            print(profile(program.process.pid, args.seconds, args.top, args.rate, args.native, args.by_thread),
                  flush=True)
    finally:
        program.stop()
    if args.cprofile and argv[1:3] == ["-m", "tuiprof.cli"]:  # a tuiprof(...) command line (not fake-gpu's)
        print(profile_event_loop(argv, args), flush=True)


FRAMES_PROGRAM = """
import asyncio, sys, time
from tuiprof.client.sources import ReplaySource
from tuiprof.model import record
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp

async def main(path, frames):
    events = list(record.read(path))
    app = TuiprofApp(ReplaySource(events, speed=0))
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("enter")  # gpu-node-01, the first row
        await pilot.pause(0.3)
        screen = app.screen
        messages = [e.message for e in events if isinstance(e, SnapshotReceived) and e.host == screen.address]
        refresh = repaint = 0.0
        for frame in range(frames):
            app.cluster.apply(SnapshotReceived(screen.address, app.cluster.now + 1, messages[frame % len(messages)]))
            start = time.process_time()
            app.render_views()
            refreshed = time.process_time()
            # What Screen._on_timer_update does with the widgets that asked for a repaint.
            for widget in screen.walk_children(with_self=False):
                if widget._repaint_required and widget.display:
                    widget._repaint_required = False
                    screen._dirty_widgets.add(widget)
            marked = time.process_time()
            screen._compositor.update_widgets(screen._dirty_widgets)
            screen._compositor_refresh()
            repaint += time.process_time() - marked
            refresh += refreshed - start
            await pilot.pause()
        print(f"{screen.address}: {frames} frames, CPU per frame: view refresh {refresh / frames * 1000:.2f} ms, "
              f"repaint {repaint / frames * 1000:.2f} ms")

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""
"""``python -c`` this, then the fixture and a number of frames (see ``--frames``)."""


def measure_frames(args: argparse.Namespace) -> None:
    subprocess.run([sys.executable, "-c", FRAMES_PROGRAM, str(FIXTURE), str(args.frames)],
                   check=True, cwd=args.source, env=source_env(args.source))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Agentd:
    """A separate ``agentd --interval-ms 1000`` on free ports, its collectors' durations read from /metrics."""

    def __init__(self, source: pathlib.Path) -> None:
        self.port, self._metrics_port = free_port(), free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentd.cli", "--port", str(self.port), "--metrics-port", str(self._metrics_port),
             "--interval-ms", "1000", "--trace-dir", tempfile.mkdtemp(prefix="tuiprof-bench-traces-")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=source, env=source_env(source))
        self.durations: dict[str, list[float]] = collections.defaultdict(list)

    def sample(self) -> None:
        """Each collector's latest ``tuiprof_collector_duration_seconds``."""
        url = f"http://127.0.0.1:{self._metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=2).read().decode()
        pattern = r'^tuiprof_collector_duration_seconds\{[^}]*collector="([^"]+)"[^}]*\} (\S+)$'
        for collector, value in re.findall(pattern, text, re.M):
            self.durations[collector].append(float(value))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window (default 30)")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before measuring (default 8)")
    parser.add_argument("--only", default="embedded,connect,replay", help="runs to do, comma-separated")
    parser.add_argument("--profile", action="store_true", help="then sample each console with py-spy")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples a second (default 200)")
    parser.add_argument("--native", action="store_true", help="py-spy profiles include C functions")
    parser.add_argument("--by-thread", action="store_true", help="py-spy profiles also per thread")
    parser.add_argument("--nvitop-path", type=pathlib.Path, help="for the nvitop run: nvitop and its nvidia-ml-py")
    parser.add_argument("--cprofile", action="store_true",
                        help="then run each console again with cProfile on in its event loop")
    parser.add_argument("--source", type=pathlib.Path, default=REPO,
                        help="the source tree to run (default: this checkout)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile (default 25)")
    parser.add_argument("--frames", type=int, default=0,
                        help="instead: N frames of the 8-GPU host view in process, CPU per frame")
    args = parser.parse_args()
    if args.frames:
        measure_frames(args)
        return 0
    only = set(args.only.split(","))
    if "embedded" in only:
        run_console("embedded", tuiprof("--interval", "1"), args)
    if "fake-gpu" in only:
        run_console("fake-gpu", [sys.executable, "-c", FAKE_GPU_CONSOLE, str(REPO / "tests"), "--interval", "1"],
                    args)
    if "connect" in only:
        agent = Agentd(args.source)
        try:
            run_console("connect", tuiprof("connect", f"127.0.0.1:{agent.port}", "--interval", "1"), args, agent)
        finally:
            agent.stop()
    if "nvitop" in only:
        if args.nvitop_path is None:
            parser.error("the nvitop run needs --nvitop-path")
        run_console("nvitop", [sys.executable, "-m", "nvitop", "--monitor", "full", "--interval", "1"], args,
                    env={"PYTHONPATH": str(args.nvitop_path)})
    if "replay" in only:
        windows = 1 + args.profile + args.cprofile
        recording = looped_fixture((args.warmup + args.seconds) * windows + 10)
        try:
            run_console("replay", tuiprof("replay", "--speed", "1", str(recording)), args)
        finally:
            recording.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
