"""CPU of an idle rank under libtuiprof_hook.so: what the writer thread costs when nothing happens,
and whether a burst of records right after a quiet spell still fits.

A Python process started with LD_PRELOAD=<library> records one step (which starts
the hook: segment + writer thread) and then sleeps. Over ``--seconds`` this reads,
from /proc, the CPU time (utime + stime) of the whole process and of the writer
thread ("tuiprof-writer"), and the writer's voluntary context switches (one per
sleep, so: its wake-ups). Then the process submits ``--burst`` steps as fast as
ctypes can call (millions a second: far above a real job's record rate, and more
than the 8192-record queue holds), flushes, and the records the segment counts as
dropped are read. Rounds alternate between the libraries given, so a loaded machine
slows them alike. Results go to bench/native/native_idle.md by hand.

    .venv/bin/python bench/native/native_idle.py [--seconds 10] [--rounds 3] [--burst 20000] LIB [LIB ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

from tuiprof_native import segment

IDLE_PROGRAM = ("import ctypes, sys\n"
                "lib = ctypes.CDLL(None)\n"
                "assert lib.tuiprof_record_step() == 1, 'hook did not start'\n"
                "print('up', flush=True)\n"
                "for line in sys.stdin:\n"
                "    step = lib.tuiprof_record_step\n"
                "    for _ in range(int(line)):\n"
                "        step()\n"
                "    lib.tuiprof_flush(5000)\n"
                "    print('done', flush=True)\n")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat_path: pathlib.Path) -> float:
    """utime + stime of a /proc/<pid>[/task/<tid>]/stat, in seconds."""
    fields = stat_path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of proc(5)


def voluntary_switches(status_path: pathlib.Path) -> int:
    for line in status_path.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise ValueError(f"no voluntary_ctxt_switches in {status_path}")


def writer_task(pid: int) -> pathlib.Path:
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "tuiprof-writer":
            return task
    raise RuntimeError(f"pid {pid} has no tuiprof-writer thread")


def measure(library: str, seconds: float, burst: int) -> dict[str, float]:
    env = {**os.environ, "LD_PRELOAD": library}
    proc = subprocess.Popen([sys.executable, "-c", IDLE_PROGRAM], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    directory, own = pathlib.Path(segment.SEGMENT_DIR), f"tuiprof-{os.getuid()}-{proc.pid}-"  # its files' names
    try:
        if proc.stdout.readline().strip() != "up":
            raise RuntimeError(f"idle program under {library} did not start")
        (path,) = directory.glob(own + "[0-9a-f]" * segment.STEM_RANDOM_DIGITS)  # the segment, not its side files
        time.sleep(0.5)  # past start-up and the writer's first back-off steps
        proc_stat = pathlib.Path(f"/proc/{proc.pid}/stat")
        task = writer_task(proc.pid)
        before = (time.monotonic(), cpu_seconds(proc_stat), cpu_seconds(task / "stat"),
                  voluntary_switches(task / "status"))
        time.sleep(seconds)
        after = (time.monotonic(), cpu_seconds(proc_stat), cpu_seconds(task / "stat"),
                 voluntary_switches(task / "status"))
        proc.stdin.write(f"{burst}\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"burst under {library} did not finish")
        with segment.Segment(path) as seg:
            dropped = seg.header().counters.dropped_records
    finally:
        proc.kill()
        proc.wait()
        for file in directory.glob(own + "*"):
            file.unlink(missing_ok=True)
    wall = after[0] - before[0]
    return {"process_cpu_percent": 100 * (after[1] - before[1]) / wall,
            "writer_cpu_percent": 100 * (after[2] - before[2]) / wall,
            "writer_wakeups_per_s": (after[3] - before[3]) / wall,
            "burst_dropped": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=20000)
    parser.add_argument("libraries", nargs="+", metavar="LIB")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {lib: [] for lib in args.libraries}
    for round_ in range(args.rounds):
        for lib in args.libraries:
            r = measure(lib, args.seconds, args.burst)
            results[lib].append(r)
            print(f"round {round_ + 1} {lib}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    for lib, rows in results.items():
        print(f"median {lib}: " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):.2f}" for k in rows[0]))


if __name__ == "__main__":
    main()
