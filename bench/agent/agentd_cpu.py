"""agentd's sampling cost on this machine, for two source trees in turn (before/after a change).

Per round and per tree, in that order, so that both see the same load:

1. ``collect()`` of the host and pmu collectors, called ``--calls`` times in a child process
   (the tree's code): mean wall time and mean CPU time of the calling thread per call; and,
   for a many-core host, the CPU figures of a made-up /proc/stat of ``--cpus`` CPUs (two
   readings, a 2000-IRQ ``intr`` line): ``parse_proc_stat`` and the CPU figures (``fill_cpu_stats``
   and ``fill_numa_nodes``, one node of every CPU);
   and the RDMA counters of a made-up /sys/class/infiniband (8 devices, one port each, 40
   counters and 30 hw_counters: a tmp tree, so the kernel's side of real sysfs is not in it);
2. a whole ``agentd --interval-ms 1000`` (the tree's code, no client): its CPU time (the
   sum of its threads' /proc/PID/task/*/schedstat) over ``--seconds`` after ``--warmup`` seconds, with
   nothing scraping it; then ``/metrics`` scraped once a second for ``--scrape-seconds``:
   the mean of each collector's own ``tuiprof_collector_duration_seconds`` (wall time of
   its latest collect, as the runner measures it);
3. the console's embedded agent without the Textual UI: a process running the tree's
   ``LocalSource`` (the embedded agent and how the console takes its snapshots: over loopback
   gRPC before the in-process feed, in-process after), its CPU over ``--seconds`` as in 2.

Make each tree with ``git archive <commit> | tar -x -C /tmp/before`` and copy the built
extensions (``tuiprof_native/*.so``) into it. Step 1 calls the host readers (``host_cpu``,
``host_numa``, ``host_rdma``) by name: a tree from before the host collector was split into
them (issue 26) needs this file as it was then. Run as root (system-wide perf counters)::

    .venv/bin/python bench/agent/agentd_cpu.py --source before=/tmp/before --source after=/tmp/after --rounds 5

Prints a table and writes ``--out`` (JSON). bench/agent/agentd_cpu.md has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

DURATION = re.compile(r'^tuiprof_collector_duration_seconds\{[^}]*collector="([^"]+)"[^}]*\} (\S+)$', re.M)

# Runs in the child, with the tree under test first on sys.path.
COLLECT_CALLS = """
import json, sys, time
from agentd.collectors import host_cpu, host_numa
from agentd.collectors.host import HostCollector
from agentd.collectors.host_rdma import RdmaReader
from agentd.collectors.host_roots import HostRoots
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.collectors.pmu import PmuCollector
calls, cpus = int(sys.argv[1]), int(sys.argv[2])
result = {}

def proc_stat(reading):
    lines = ["cpu " + " ".join(str(1000 * reading * cpus + i) for i in range(10))]
    lines += [f"cpu{c} " + " ".join(str(1000 * reading + c + 7 * i * reading) for i in range(10)) for c in range(cpus)]
    lines.append("intr 123456 " + " ".join("5" for _ in range(2000)))
    lines.append("ctxt 1\\nbtime 1\\nprocesses 555\\nsoftirq 99 1 2 3")
    return "\\n".join(lines) + "\\n"

texts = [proc_stat(1), proc_stat(2)]
stats = [host_cpu.parse_proc_stat(text, 100) for text in texts]
nodes = [{0: host_numa.NodeTimes(tuple(range(cpus)), stat.total)} for stat in stats]

def cpu_stats():
    cpu = pb.CpuStats()
    host_cpu.fill_cpu_stats(cpu, stats[0], stats[1])
    host_numa.fill_numa_nodes(cpu, nodes[0], nodes[1])

for name, work in (("parse_proc_stat", lambda: host_cpu.parse_proc_stat(texts[1], 100)),
                   ("cpu_stats", cpu_stats)):
    cpu = time.thread_time()
    for _ in range(calls):
        work()
    result[f"{cpus} CPUs {name}"] = {"cpu_ms": 1e3 * (time.thread_time() - cpu) / calls}

import os, tempfile
with tempfile.TemporaryDirectory() as root:
    for device in range(8):
        port = os.path.join(root, "class", "infiniband", f"mlx5_{device}", "ports", "1")
        for kind, count in (("counters", 40), ("hw_counters", 30)):
            os.makedirs(os.path.join(port, kind))
            for number in range(count):
                with open(os.path.join(port, kind, f"{kind}_{number}"), "w") as file:
                    file.write(f"{number * 1000}\\n")
    rdma = RdmaReader(HostRoots(sys=root))
    cpu = time.thread_time()
    for sample in range(calls):
        rdma.read(pb.HostSnapshot(), float(sample))
    result["8 RDMA ports read"] = {"cpu_ms": 1e3 * (time.thread_time() - cpu) / calls}
for name, factory in (("host", HostCollector), ("pmu", PmuCollector)):
    collector = factory(1.0)
    collector.collect()
    collector.collect()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        collector.collect()
    result[name] = {"wall_ms": 1e3 * (time.perf_counter() - wall) / calls,
                    "cpu_ms": 1e3 * (time.thread_time() - cpu) / calls}
    collector.close()
print(json.dumps(result))
"""


# Runs in the child: the console's source for this host, without the UI (events counted only).
EMBEDDED = """
import asyncio, sys
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.sources import LocalSource
async def main():
    await LocalSource(ConnectionOptions(interval_ms=1000)).run(lambda event: None)
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """CPU time of each thread of the process so far, in ns (/proc/PID/stat counts only 10 ms ticks)."""
    times = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            times[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return times


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id, from py-spy's dump (gRPC's own threads are named by the kernel)."""
    names = {tid: pathlib.Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() for tid in thread_cpu_ns(pid)}
    py_spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    names.update({int(tid): name for tid, name in re.findall(r'^Thread (\d+) \(\w+\): "([^"]+)"', dump, re.M)})
    return names


def environment(source: pathlib.Path) -> dict[str, str]:
    """The tree's packages ahead of the editable install of this checkout."""
    return {**os.environ, "PYTHONPATH": str(source)}


def collect_calls(source: pathlib.Path, calls: int, cpus: int) -> dict[str, dict[str, float]]:
    output = subprocess.run([sys.executable, "-c", COLLECT_CALLS, str(calls), str(cpus)], cwd=source, env=environment(source),
                            capture_output=True, text=True, check=True, timeout=600).stdout
    return dict(json.loads(output.splitlines()[-1]))


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {name: float(value) for name, value in DURATION.findall(text)}


def process_cpu(pid: int, warmup: float, seconds: float) -> dict[str, float]:
    """CPU ms per second of each of the process's threads (by name) over ``seconds`` after ``warmup``."""
    time.sleep(warmup)
    names = thread_names(pid)
    start_cpu, start = thread_cpu_ns(pid), time.monotonic()
    time.sleep(seconds)
    end_cpu, elapsed = thread_cpu_ns(pid), time.monotonic() - start
    per_thread: dict[str, float] = {}
    for tid, ns in end_cpu.items():
        name = names.get(tid, "new thread")
        per_thread[name] = per_thread.get(name, 0.0) + (ns - start_cpu.get(tid, 0)) / 1e6 / elapsed
    return per_thread


def embedded_run(source: pathlib.Path, warmup: float, seconds: float) -> dict[str, Any]:
    console = subprocess.Popen([sys.executable, "-c", EMBEDDED], cwd=source, env=environment(source),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        per_thread = process_cpu(console.pid, warmup, seconds)
    finally:
        console.terminate()
        console.wait(10)
    return {"cpu_ms_per_s": sum(per_thread.values()), "thread_cpu_ms_per_s": dict(sorted(per_thread.items()))}


def agent_run(source: pathlib.Path, warmup: float, seconds: float, scrape_seconds: float) -> dict[str, Any]:
    metrics_port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "agentd.cli", "--port", str(free_port()), "--metrics-port", str(metrics_port),
         "--interval-ms", "1000"],
        cwd=source, env=environment(source), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        per_thread = process_cpu(agent.pid, warmup, seconds)
        cpu_ms_per_s = sum(per_thread.values())
        durations: dict[str, list[float]] = {}
        until = time.monotonic() + scrape_seconds
        while time.monotonic() < until:
            for name, value in scrape(metrics_port).items():
                durations.setdefault(name, []).append(1e3 * value)
            time.sleep(1.0)
    finally:
        agent.terminate()
        agent.wait(10)
    return {"cpu_ms_per_s": cpu_ms_per_s, "thread_cpu_ms_per_s": dict(sorted(per_thread.items())),
            "collector_ms_mean": {name: statistics.fmean(values) for name, values in sorted(durations.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", action="append", required=True, metavar="LABEL=DIR",
                        help="a tree to measure (give two: before and after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--cpus", type=int, default=224, help="CPUs of the made-up /proc/stat")
    parser.add_argument("--collect-only", action="store_true", help="only the collect() timings, no agentd")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--scrape-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/.work/agentd_cpu.json"))
    args = parser.parse_args()
    sources = {}
    for item in args.source:
        label, equals, directory = item.partition("=")
        if not equals or not pathlib.Path(directory, "agentd").is_dir():
            parser.error(f"--source {item}: give LABEL=DIR, DIR a source tree with agentd/ in it")
        sources[label] = pathlib.Path(directory).resolve()
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in sources}
    for round_number in range(args.rounds):
        for label, source in sources.items():
            run: dict[str, Any] = {"collect": collect_calls(source, args.calls, args.cpus)}
            if not args.collect_only:
                run["agent"] = agent_run(source, args.warmup, args.seconds, args.scrape_seconds)
                run["embedded"] = embedded_run(source, args.warmup, args.seconds)
            runs[label].append(run)
            print(f"round {round_number + 1} {label}: {json.dumps(run)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"load_at_end": os.getloadavg(), "cpus": os.cpu_count(), "runs": runs}, indent=1))
    print_medians(runs)
    return 0


def print_medians(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Per tree, the median over rounds of each figure."""
    rows: dict[str, dict[str, float]] = {}
    for label, label_runs in runs.items():
        figures: dict[str, list[float]] = {}
        for run in label_runs:
            collect = run["collect"]
            values = {**{f"collect() {name} wall ms": c["wall_ms"] for name, c in collect.items() if "wall_ms" in c},
                      **{f"collect() {name} CPU ms": c["cpu_ms"] for name, c in collect.items()}}
            if "agent" in run:
                agent = run["agent"]
                values.update({"agent CPU ms/s": agent["cpu_ms_per_s"],
                               **{f"  thread {name} ms/s": v for name, v in agent["thread_cpu_ms_per_s"].items()},
                               **{f"agentd {name} collect ms": v for name, v in agent["collector_ms_mean"].items()}})
            if "embedded" in run:
                embedded = run["embedded"]
                values.update({"embedded CPU ms/s": embedded["cpu_ms_per_s"],
                               **{f"  embedded thread {name} ms/s": v
                                  for name, v in embedded["thread_cpu_ms_per_s"].items()}})
            for key, value in values.items():
                figures.setdefault(key, []).append(value)
        rows[label] = {key: statistics.median(values) for key, values in figures.items()}
    keys = sorted({key for row in rows.values() for key in row},
                  key=lambda k: (not k.startswith("agent CPU"), not k.startswith("embedded CPU"), k))
    print(f"\n{'median of the rounds':34}" + "".join(f"{label:>10}" for label in rows))
    for key in keys:
        print(f"{key:34}" + "".join(f"{row[key]:10.3f}" if key in row else f"{'':>10}" for row in rows.values()))


if __name__ == "__main__":
    sys.exit(main())
