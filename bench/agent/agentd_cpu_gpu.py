"""Where agentd's CPU goes on a GPU host: process CPU per second, each collector's wall time
per collect (its own ``tuiprof_collector_duration_seconds``) and CPU per second (the rate of
its ``tuiprof_collector_cpu_seconds_total`` over the window), and a py-spy profile.

Run on the GPU machine (see ``agentd_cpu_gpu.sh``): starts ``agentd --interval-ms 1000``,
lets it warm up, reads /proc/PID/stat over ``--seconds`` while scraping /metrics once a
second, then records ``--profile-seconds`` with py-spy (its own process; the agent is not
paused) and prints the folded stacks' heaviest frames. Everything also goes to
``--out``/result.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.request

DURATION = re.compile(r'^tuiprof_collector_duration_seconds\{[^}]*collector="([^"]+)"[^}]*\} (\S+)$', re.M)
COLLECTOR_CPU = re.compile(r'^tuiprof_collector_cpu_seconds_total\{[^}]*collector="([^"]+)"[^}]*\} (\S+)$', re.M)
NVML_CALLS = re.compile(r'^tuiprof_agent_nvml_calls_total\{[^}]*function="([^"]+)"[^}]*\} (\S+)$', re.M)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def scrape(port: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each collector's latest wall time per collect, and its CPU seconds so far."""
    text = metrics(port)
    return ({name: float(value) for name, value in DURATION.findall(text)},
            {name: float(value) for name, value in COLLECTOR_CPU.findall(text)})


def nvml_calls(port: int) -> dict[str, float]:
    """The agent's own NVML calls so far, per function (summed over GPUs)."""
    calls: dict[str, float] = collections.defaultdict(float)
    for function, value in NVML_CALLS.findall(metrics(port)):
        calls[function] += float(value)
    return calls


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (/proc/PID/status) and Pss (/proc/PID/smaps_rollup), KiB."""
    found = {}
    for path, names in ((f"/proc/{pid}/status", ("VmRSS", "VmHWM")), (f"/proc/{pid}/smaps_rollup", ("Pss",))):
        for line in pathlib.Path(path).read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in names:
                found[name] = int(rest.split()[0])
    return found


MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def rss_by_mapping(pid: int, top: int = 12) -> list[tuple[str, int]]:
    """What the RSS is made of: KiB per mapped file (anonymous memory as [anon], [heap]), largest first."""
    sizes: collections.Counter[str] = collections.Counter()
    mapping = "[anon]"
    for line in pathlib.Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if MAPPING.match(line):
            fields = line.split()
            mapping = fields[5].rsplit("/", 1)[-1] if len(fields) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            sizes[mapping] += int(line.split()[1])
    return sizes.most_common(top)


def heaviest(folded: pathlib.Path, top: int) -> dict[str, list[tuple[str, float]]]:
    """Self and inclusive shares of the heaviest frames in py-spy's raw (folded) output."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            incl_counts[frame] += count
    share = lambda c: [(f, round(n / max(total, 1), 4)) for f, n in c.most_common(top)]  # noqa: E731
    return {"samples": [("total", total)], "self": share(self_counts), "inclusive": share(incl_counts)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=15)
    parser.add_argument("--profile-seconds", type=int, default=40)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/.work/agentd_cpu_gpu"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    with open(args.out / "agentd.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port", str(metrics_port),
             "--interval-ms", "1000"],
            stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        time.sleep(args.warmup)
        durations: dict[str, list[float]] = collections.defaultdict(list)
        start_cpu, start = cpu_seconds(agent.pid), time.monotonic()
        _, collector_cpu_start = scrape(metrics_port)
        nvml_start = nvml_calls(metrics_port)
        while time.monotonic() - start < args.seconds:
            latest, collector_cpu = scrape(metrics_port)
            for name, value in latest.items():
                durations[name].append(value)
            time.sleep(1.0)
        elapsed = time.monotonic() - start
        cpu_per_s = (cpu_seconds(agent.pid) - start_cpu) / elapsed
        nvml_per_s = {f: round((n - nvml_start.get(f, 0.0)) / elapsed, 3) for f, n in nvml_calls(metrics_port).items()}
        memory = memory_kib(agent.pid)
        memory_parts = rss_by_mapping(agent.pid)
        folded = args.out / "agentd.folded"
        subprocess.run(
            ["py-spy", "record", "--pid", str(agent.pid), "--duration", str(args.profile_seconds), "--rate", "250",
             "--format", "raw", "--nonblocking", "--threads", "--output", str(folded)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        result = {
            "agent_cpu_ms_per_s": round(cpu_per_s * 1000, 2),
            "memory_kib": memory,
            "rss_kib_by_mapping": memory_parts,
            "nvml_calls_per_s": nvml_per_s,
            "collector_ms_mean": {n: round(1000 * sum(v) / len(v), 3) for n, v in durations.items()},
            "collector_ms_max": {n: round(1000 * max(v), 3) for n, v in durations.items()},
            "collector_cpu_ms_per_s": {n: round(1000 * (v - collector_cpu_start.get(n, 0.0)) / elapsed, 3)
                                       for n, v in collector_cpu.items()},
            "profile": heaviest(folded, 40),
        }
    finally:
        agent.terminate()
        agent.wait(10)
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
