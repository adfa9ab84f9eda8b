"""agentd's CPU and memory while a local user floods its Kineto endpoint with 10,000 datagrams a second.

A real agentd (all collectors, default 1 s interval) binds the abstract
``@dynolog@`` socket, as on a node; the bench runs in a private network
namespace (``unshare -n``, so needs root) so that no other agent's socket is in
the way. One sender process paces datagrams at ``--rate`` per second, in bursts
every 10 ms, for ``--seconds`` per scenario:

- ``idle``: nothing sent (the baseline);
- ``polls``: valid libkineto polls from 8 client sockets of one process, each
  answered (the replies are read, as libkineto does);
- ``garbage``: datagrams the endpoint refuses (rotating causes: truncated,
  size mismatch, unknown type, bad pid count), each logged at most once a minute;
- ``new-jobs``: valid polls whose job id changes every time (the registry
  replaces the entry at each one; its log line is rate-limited).

Per scenario: the agent's CPU (user+system from /proc, % of one core), its RSS
at the end and its peak RSS, datagrams sent and replies received, and the lines
the agent logged.

    sudo .venv/bin/python bench/agent/agentd_datagram_flood.py [--rate 10000] [--seconds 20]

Prints a markdown table (paste into bench/agent/agentd_datagram_flood.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from agentd.kineto import wire
from agentd.kineto.endpoint import ABSTRACT_NAME

CLIENTS = 8
BURST_SECONDS = 0.01
SETTLE_SECONDS = 5.0
GARBAGE = [b"\x10\0\0", struct.pack("<Q32s", 99, b"req") + b"\0" * 20, wire.encode(b"hello", b"\0" * 8),
           wire.encode(b"req", struct.pack("<iiq", 3, 0, 0))]


@dataclass
class Result:
    scenario: str
    cpu_percent: float
    rss_mib: float
    peak_rss_mib: float
    sent: int
    replies: int
    log_lines: int


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def datagram(scenario: str, n: int) -> bytes:
    if scenario == "garbage":
        return GARBAGE[n % len(GARBAGE)]
    job_id = n if scenario == "new-jobs" else 0
    return wire.poll_request(wire.WANTS_ACTIVITIES, job_id, (os.getpid(), os.getppid()))


def flood(scenario: str, rate: int, seconds: float) -> tuple[int, int]:
    """Send ``rate`` datagrams a second for ``seconds`` (none when idle); (sent, replies read)."""
    directory = tempfile.mkdtemp(prefix="tpflood")
    clients = []
    for _ in range(CLIENTS):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        client.bind(os.path.join(directory, f"dynoconfigclient{uuid.uuid4()}"))
        client.connect(ABSTRACT_NAME)
        # A send waits while the agent's queue is full, as a determined flooder's would, up to 1 s.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 1, 0))
        clients.append(client)
    sent = replies = 0
    per_burst = round(rate * BURST_SECONDS)
    started = time.monotonic()
    try:
        while (now := time.monotonic()) < started + seconds:
            due = int((now - started) / BURST_SECONDS) * per_burst if scenario != "idle" else 0
            while sent < due:
                clients[sent % CLIENTS].send(datagram(scenario, sent))
                sent += 1
                if sent % CLIENTS == 0:
                    replies += drain(clients)  # read replies as they come, or our own queues fill
            time.sleep(max(0.0, BURST_SECONDS - (time.monotonic() - now)))
        time.sleep(0.2)
        replies += drain(clients)
    finally:
        for client in clients:
            client.close()
        shutil.rmtree(directory, ignore_errors=True)
    return sent, replies


def drain(clients: list[socket.socket]) -> int:
    read = 0
    for client in clients:
        while True:
            try:
                client.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            read += 1
    return read


def wait_bound(log_path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            if "Kineto IPC endpoint listening" in f.read():
                return
        time.sleep(0.2)
    raise RuntimeError(f"agentd did not bind @dynolog@ within {timeout} s; see {log_path}")


def count_lines(log_path: str) -> int:
    with open(log_path, errors="replace") as f:
        return sum(1 for _ in f)


def run(rate: int, seconds: float) -> list[Result]:
    work = tempfile.mkdtemp(prefix="tpbench")
    log_path = os.path.join(work, "agentd.log")
    env = {k: v for k, v in os.environ.items() if k not in ("TUIPROF_TOKEN", "KINETO_IPC_SOCKET_DIR")}
    with open(log_path, "wb") as log_file:
        agent = subprocess.Popen([sys.executable, "-m", "agentd.cli", "--port", "1779", "--metrics-port", "9779",
                                  "--trace-dir", os.path.join(work, "traces")],
                                 stdout=subprocess.DEVNULL, stderr=log_file, env=env)
    results = []
    try:
        wait_bound(log_path)
        time.sleep(SETTLE_SECONDS)
        for scenario in ("idle", "polls", "garbage", "new-jobs"):
            lines, cpu = count_lines(log_path), process_cpu_seconds(agent.pid)
            wall = time.monotonic()
            sent, replies = flood(scenario, rate, seconds)
            cpu_percent = 100 * (process_cpu_seconds(agent.pid) - cpu) / (time.monotonic() - wall)
            rss, peak = memory_mib(agent.pid)
            results.append(Result(scenario, cpu_percent, rss, peak, sent, replies, count_lines(log_path) - lines))
    finally:
        agent.terminate()
        agent.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return results


def table(results: list[Result], rate: int, seconds: float) -> str:
    rows = ["| scenario | sent (/s) | replies | agent CPU (% of a core) | RSS MiB (peak) | log lines |",
            "|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.scenario} | {r.sent} ({r.sent / seconds:.0f}) | {r.replies} | {r.cpu_percent:.1f} | "
                    f"{r.rss_mib:.1f} ({r.peak_rss_mib:.1f}) | {r.log_lines} |")
    header = (f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}; "
              f"target {rate} datagrams/s, {seconds:.0f} s per scenario")
    return header + "\n\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.in_namespace:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            sys.exit("agentd_datagram_flood: needs root and unshare (it runs in a private network namespace, "
                     "where its agent can bind @dynolog@ whatever else runs on this host)")
        inner = f"ip link set lo up && exec {sys.executable} {' '.join(sys.argv)} --in-namespace"
        sys.exit(subprocess.run(["unshare", "-n", "sh", "-c", inner]).returncode)
    print(table(run(args.rate, args.seconds), args.rate, args.seconds))


if __name__ == "__main__":
    main()
