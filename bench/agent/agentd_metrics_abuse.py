"""One user's ops and /metrics scrapes against the root agent: its memory, /healthz, and another user's snapshots.

The abuse of issue 24 item 4, as the second user (tuiprof-hostile) in a private mount + network
namespace (tests/testkit/namespaces.py; its /dev/shm enlarged to hold the segments): a root
``agentd`` (1 s interval) runs while

1. ``idle``: nothing but the agent, for ``--idle-seconds``;
2. ``ops``: the user publishes 256 segments (the per-owner file cap) of 511 GEMM ops each
   (tests/testkit/op_segments.py: their own ``sleep`` processes, real claims), for ``--idle-seconds``;
3. ``scrapes``: the user also runs ``--scrapers`` threads GETting /metrics back to back for
   ``--scrape-seconds`` (a new connection each).

Throughout, root (another user) watches the agent's snapshots over gRPC (the interval between
snapshots as they arrive) and asks /healthz every 0.5 s (status and latency), and the bench reads
the agent's RSS and thread count from /proc every 0.2 s. Per phase: the agent's peak RSS and
threads, root's snapshot intervals (median, max), /healthz (statuses, max latency) and the
scrapes' statuses and latencies.

``--code DIR`` runs the agent and its clients from another checkout (its built extensions in
place), e.g. the commit before the fix in a worktree:

    git worktree add --detach /tmp/before <commit>; cp tuiprof_native/*.so /tmp/before/tuiprof_native/
    .venv/bin/python bench/agent/agentd_metrics_abuse.py --code /tmp/before
    .venv/bin/python bench/agent/agentd_metrics_abuse.py

Prints one JSON document and a markdown table row per phase (bench/agent/agentd_metrics_abuse.md). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from native.segment_forge import recorded_segment  # noqa: E402
from testkit.namespaces import HOSTILE_USER, Namespace, User  # noqa: E402
from testkit.op_segments import MAX_OPS_PER_SEGMENT, PUBLISH, check_ops, with_ops  # noqa: E402
from testkit.ports import free_port  # noqa: E402

AGENTD = str(pathlib.Path(sys.executable).parent / "agentd")
SEGMENTS = 256
SHM_SIZE = "1g"  # 256 slot tables of 0.3-1.4 MB (the layout's slot size)
# The agent is killed past this RSS (the unfixed agent reached 4.9 GB in the issue's run).
RSS_LIMIT_KIB = 6 << 20

# Root: the interval between snapshots as they arrive on a Watch stream (as the console watches: messages up
# to 64 MiB), until stdin closes; then one JSON list of [seconds since start, interval] pairs.
WATCH = """
import json, sys, threading, time
import grpc
from agentd.proto import tuiprof_agent_pb2 as pb, tuiprof_agent_pb2_grpc as pb_grpc
start, last, seen = time.monotonic(), None, []
def watch():
    global last
    options = [("grpc.max_receive_message_length", 64 << 20)]  # as the console's (tuiprof/client/channel.py)
    with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}", options=options) as channel:
        for _ in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest()):
            now = time.monotonic()
            if last is not None:
                seen.append([last - start, now - last])
            last = now
threading.Thread(target=watch, daemon=True).start()
sys.stdin.read()
print(json.dumps(seen))
"""
# Root: GET /healthz every 0.5 s until stdin closes; then [seconds since start, status or error, latency].
HEALTH = """
import http.client, json, sys, threading, time
start, seen, stop = time.monotonic(), [], threading.Event()
def ask():
    while not stop.wait(0.5):
        began = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
        try:
            connection.request("GET", "/healthz")
            outcome = connection.getresponse().status
        except OSError as exc:
            outcome = type(exc).__name__
        finally:
            connection.close()
        seen.append([began - start, outcome, time.monotonic() - began])
thread = threading.Thread(target=ask)
thread.start()
sys.stdin.read()
stop.set()
thread.join()
print(json.dumps(seen))
"""
# The user: argv[2] threads GETting /metrics back to back for argv[3] seconds; [status or error, latency] each.
SCRAPE = """
import http.client, json, sys, threading, time
port, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
seen, lock = [], threading.Lock()
def scrape():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            response.read()
            outcome = response.status
        except OSError as exc:
            outcome = type(exc).__name__
        finally:
            connection.close()
        with lock:
            seen.append([outcome, time.monotonic() - began])
workers = [threading.Thread(target=scrape) for _ in range(threads)]
for worker in workers: worker.start()
for worker in workers: worker.join()
print(json.dumps(seen))
"""


class Sampler(threading.Thread):
    """The agent's RSS (KiB) and threads every 0.2 s, from /proc; kills it past RSS_LIMIT_KIB."""

    def __init__(self, process: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.process, self.samples, self.killed = process, [], False
        self.start_time = time.monotonic()
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(0.2):
            try:
                fields = dict(line.split(":", 1)
                              for line in pathlib.Path(f"/proc/{self.process.pid}/status").read_text().splitlines())
            except OSError:
                return
            rss = int(fields["VmRSS"].split()[0])
            self.samples.append((time.monotonic() - self.start_time, rss, int(fields["Threads"])))
            if rss > RSS_LIMIT_KIB:
                self.killed = True
                self.process.kill()
                return

    def stop(self) -> None:
        self._stopping.set()
        self.join()


def in_window(rows: list, start: float, end: float) -> list:
    return [row for row in rows if start <= row[0] < end]


def summary(phase: str, start: float, end: float, sampler: Sampler, watch: list, health: list,
            scrapes: list | None) -> dict:
    samples = in_window(sampler.samples, start, end)
    intervals = [gap for at, gap in in_window(watch, start, end)]
    asked = in_window(health, start, end)
    out = {
        "phase": phase,
        "rss_mib_peak": max(s[1] for s in samples) / 1024 if samples else None,
        "threads_peak": max(s[2] for s in samples) if samples else None,
        "snapshot_interval_median_s": statistics.median(intervals) if intervals else None,
        "snapshot_interval_max_s": max(intervals) if intervals else None,
        "snapshots": len(intervals),
        "healthz": {str(k): sum(1 for a in asked if a[1] == k) for k in {a[1] for a in asked}},
        "healthz_max_s": max(a[2] for a in asked) if asked else None,
    }
    if scrapes is not None:
        served = sorted(latency for status, latency in scrapes if status == 200)
        out["scrapes"] = {str(k): sum(1 for s in scrapes if s[0] == k) for k in {s[0] for s in scrapes}}
        out["scrape_200_median_s"] = statistics.median(served) if served else None
        out["scrape_200_max_s"] = served[-1] if served else None
    return out


def row(result: dict) -> str:
    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)
    return (f"| {result['phase']} | {fmt(result['rss_mib_peak'], '.0f')} | {result['threads_peak']} | "
            f"{fmt(result['snapshot_interval_median_s'])} | {fmt(result['snapshot_interval_max_s'])} | "
            f"{result['healthz']} | {fmt(result['healthz_max_s'])} | {result.get('scrapes', '-')} | "
            f"{fmt(result.get('scrape_200_median_s'))} | {fmt(result.get('scrape_200_max_s'))} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=pathlib.Path, default=REPO, help="the checkout the agent runs from")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--scrapers", type=int, default=24)
    parser.add_argument("--scrape-seconds", type=float, default=30.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent runs as root and the abuse as a second user")
    hostile = User.lookup(HOSTILE_USER)
    prefix = with_ops(recorded_segment(), MAX_OPS_PER_SEGMENT)
    check_ops(prefix, MAX_OPS_PER_SEGMENT)
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"} | {"PYTHONPATH": str(args.code)}
    with Namespace.create() as ns, tempfile.TemporaryDirectory(prefix="tpbench", dir="/tmp") as base:
        pathlib.Path(base).chmod(0o755)
        ns.run(["mount", "-o", f"remount,size={SHM_SIZE}", "/dev/shm"], timeout=30).check_returncode()
        template = pathlib.Path(base) / "ops.segment"
        template.write_bytes(prefix)
        template.chmod(0o644)
        port, metrics_port = free_port(), free_port()
        with open(f"{base}/agentd.log", "wb") as log:
            agent = ns.popen([AGENTD, "--interval-ms", "1000", "--host", "127.0.0.1", "--port", str(port),
                              "--metrics-port", str(metrics_port), "--trace-dir", f"{base}/traces"],
                             stdout=subprocess.DEVNULL, stderr=log, env=env)
        time.sleep(3)
        sampler = Sampler(agent)
        sampler.start()
        clients = {name: ns.popen([sys.executable, "-c", program, str(p)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
                   for name, program, p in (("watch", WATCH, port), ("health", HEALTH, metrics_port))}
        marks = {"idle": time.monotonic() - sampler.start_time}
        time.sleep(args.idle_seconds)
        marks["ops"] = time.monotonic() - sampler.start_time
        publisher = ns.popen([sys.executable, "-c", PUBLISH, str(template), str(SEGMENTS)], user=hostile,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env | {"HOME": "/tmp"})
        assert publisher.stdout is not None and publisher.stdout.readline(), "the publisher failed"
        time.sleep(args.idle_seconds)
        marks["scrapes"] = time.monotonic() - sampler.start_time
        scraped = ns.run([sys.executable, "-c", SCRAPE, str(metrics_port), str(args.scrapers),
                          str(args.scrape_seconds)], user=hostile, env=env | {"HOME": "/tmp"},
                         timeout=args.scrape_seconds + 600)
        marks["end"] = time.monotonic() - sampler.start_time
        scrapes = json.loads(scraped.stdout) if scraped.returncode == 0 else []
        results = {name: json.loads(client.communicate("", timeout=60)[0] or "[]") for name, client in clients.items()}
        publisher.communicate("", timeout=60)
        sampler.stop()
        agent.kill()
        agent.wait(30)
        log_tail = pathlib.Path(f"{base}/agentd.log").read_text(errors="replace")[-2000:]
    phases = [summary(phase, marks[phase], marks[after], sampler, results["watch"], results["health"],
                      scrapes if phase == "scrapes" else None)
              for phase, after in (("idle", "ops"), ("ops", "scrapes"), ("scrapes", "end"))]
    commit = subprocess.run(["git", "-C", str(args.code), "log", "-1", "--format=%h %s"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"code": str(args.code), "commit": commit, "machine": platform.platform(),
                      "cpus": os.cpu_count(), "load": os.getloadavg(), "agent_killed_over_rss": sampler.killed,
                      "scrape_error": scraped.stderr[-500:] if scraped.returncode else "", "phases": phases,
                      "agent_log_tail": log_tail if sampler.killed else ""}, indent=1))
    print("| phase | agent RSS MiB (peak) | threads (peak) | root's snapshot interval median s | max s | "
          "/healthz (root, every 0.5 s) | /healthz max s | scrapes (status: count) | scrape median s | max s |")
    print("|---|--:|--:|--:|--:|---|--:|---|--:|--:|")
    for result in phases:
        print(row(result))


if __name__ == "__main__":
    main()
