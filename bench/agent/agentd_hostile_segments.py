"""The ranks collector's cost with hostile files in its segment directory, against none.

One real rank (a process under `tuiprof run` that filled its event ring, then
stopped) sits in a private folder on /dev/shm's tmpfs (a hard link to its
segment), so other jobs' segments on this host do not count. Then the ranks
collector runs as the agent runs it — ``collect()`` once per 1 s interval, in
a process of its own — for ``--seconds``, in each scenario:

- ``none``: the good rank only;
- ``one-owner``: plus ``--files`` sparse segment files of one other user
  (tuiprof-hostile): half a header and a hole (never finished: magic 0), half
  a real header whose pid is not the file's (refused, remembered);
- ``many-owners``: the same files spread over 8 uids, so no per-owner cap
  applies (the worst a set of users can do together).

The collector process reports its CPU time (getrusage, after a 3 s warm-up:
the first ticks open every file not judged yet), RSS, open fds and the per-tick wall time of ``collect()``; then the
cost of reading one rank's segment per tick (header, slots, in-flight table)
and of one whole event ring (only when a timeline asks) is timed in-process.

    .venv/bin/python bench/agent/agentd_hostile_segments.py --seconds 30 --files 2000

Prints a markdown table (paste into bench/agent/agentd_hostile_segments.md). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from tuiprof_native import segment

HOSTILE = "tuiprof-hostile"
# A rank whose event ring is full (a step, then 10000 GC pauses), then idle.
RANK = textwrap.dedent("""
    import ctypes, os, sys, time
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_record_gc.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.tuiprof_flush.argtypes = [ctypes.c_int]
    lib.tuiprof_record_step()
    t = time.time_ns()
    for _ in range(10000):
        lib.tuiprof_record_gc(t, t + 1000)
    lib.tuiprof_flush(5000)
    print("ready", flush=True)
    sys.stdin.readline()
""")
PID_OFFSET = 56  # tp_header.pid

COLLECTOR = textwrap.dedent("""
    import json, os, resource, sys, time
    from agentd.collectors.ranks import RanksCollector
    collector = RanksCollector(1.0, directory=sys.argv[1])
    collector.collect()  # warm-up: the first looks open what is not judged yet; files that never
    time.sleep(3)        # become segments are refused after 2 s (rank_claims.NOT_READY_LIMIT_NS)
    collector.collect()
    start_cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    ticks = []
    while time.monotonic() - start < float(sys.argv[2]):
        began = time.perf_counter()
        collector.collect()
        ticks.append(time.perf_counter() - began)
        time.sleep(max(0.0, 1.0 - ticks[-1]))
    wall = time.monotonic() - start
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    used = cpu.ru_utime + cpu.ru_stime - start_cpu.ru_utime - start_cpu.ru_stime
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
    print(json.dumps({"cpu_percent": 100 * used / wall, "rss_kib": rss, "ticks": ticks,
                      "fds": len(os.listdir("/proc/self/fd")), "refused": collector.refused()}))
""")


def start_rank() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_USE_DAEMON"}
    proc = subprocess.Popen([sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--", sys.executable,
                             "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def plant_hostile(folder: pathlib.Path, header: bytes, count: int, uids: list[int]) -> None:
    for n in range(count):
        uid = uids[n % len(uids)]
        path = folder / f"tuiprof-{uid}-{n + 2}"
        with open(path, "wb") as f:
            if n % 2:
                f.write(header)
            f.truncate(segment.SEGMENT_SIZE)
        os.chown(path, uid, uid)


def run_collector(folder: pathlib.Path, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-c", COLLECTOR, str(folder), str(seconds)], capture_output=True,
                          text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"the collector died ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def read_cost(path: pathlib.Path, samples: int) -> tuple[float, float]:
    """Median microseconds of one per-tick read (header, slots, in-flight) and of a whole ring."""
    with segment.Segment(path) as seg:
        tick, ring = [], []
        for _ in range(samples):
            began = time.perf_counter()
            seg.header(), seg.slots(), seg.inflight()
            tick.append(time.perf_counter() - began)
        for _ in range(max(1, samples // 10)):
            began = time.perf_counter()
            seg.events(since=0)
            ring.append(time.perf_counter() - began)
    return statistics.median(tick) * 1e6, statistics.median(ring) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=500)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the hostile files belong to other users")
    hostile_uid = pwd.getpwnam(HOSTILE).pw_uid
    rank = start_rank()
    (own,) = pathlib.Path(segment.SEGMENT_DIR).glob(f"tuiprof-{os.getuid()}-{rank.pid}-" +
                                                    "[0-9a-f]" * segment.STEM_RANDOM_DIGITS)
    header = bytearray(own.read_bytes()[: segment.HEADER_SIZE])
    header[PID_OFFSET:PID_OFFSET + 4] = (1).to_bytes(4, "little")  # pid 1 in the header, another in the name
    scenarios = {"none": [], "one-owner": [hostile_uid], "many-owners": [hostile_uid + i for i in range(8)]}
    rows = []
    try:
        for name, uids in scenarios.items():
            folder = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
            try:
                os.link(own, folder / own.name)
                if uids:
                    plant_hostile(folder, bytes(header), args.files, uids)
                rows.append((name, len(uids) and args.files, run_collector(folder, args.seconds)))
            finally:
                shutil.rmtree(folder)
        tick_us, ring_us = read_cost(own, args.samples)
    finally:
        rank.communicate("\n", timeout=10)
        own.unlink(missing_ok=True)
    print(f"Machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; "
          f"load average {os.getloadavg()[0]:.1f}; {args.seconds:.0f} s per scenario\n")
    print("| scenario | hostile files | collector CPU % | RSS MiB | fds | collect() median ms | p99 ms | refused |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    for name, files, result in rows:
        ticks = sorted(result["ticks"])
        p99 = ticks[min(len(ticks) - 1, int(0.99 * len(ticks)))]
        refused = ", ".join(f"{k} {v}" for k, v in sorted(result["refused"].items())) or "-"
        print(f"| {name} | {files} | {result['cpu_percent']:.2f} | {result['rss_kib'] / 1024:.1f} | {result['fds']} "
              f"| {statistics.median(ticks) * 1e3:.2f} | {p99 * 1e3:.2f} | {refused} |")
    print(f"\nOne rank's per-tick read (header + slots + in-flight, pread): {tick_us:.1f} us median; "
          f"the whole event ring ({segment.RING_CAPACITY} entries, timelines only): {ring_us:.0f} us median")


if __name__ == "__main__":
    main()
