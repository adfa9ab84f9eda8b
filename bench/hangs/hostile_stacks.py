"""What 4 clients looping GetStacks(native) cost a CPU-bound rank, through a real agentd.

Run (root, or a user allowed to ptrace the rank):
    .venv/bin/python bench/hangs/hostile_stacks.py [--phase-s 15] [--loops 4]

Starts agentd (real collectors) and one CPU-bound Python rank in tuiprof run's
environment (so the ranks collector reports it), which prints how many loop
iterations it did each second. Phases, in turn: nothing; ``--loops`` threads
calling GetStacks(take_now, native, pids=[rank]) as fast as answered; nothing;
``--loops`` threads running ``py-spy dump --native`` on the rank back to back
(what every GetStacks cost before dumps were shared and duty-limited). Prints
the rank's mean iterations/s per phase and the loss against the mean of the
quiet phases on either side.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from agentd.hang import pyspy
from agentd.hang.stacks import MAX_DUTY, MIN_GAP_SECONDS
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.commands.run import launch_environment

AGENTD = pathlib.Path(sys.executable).parent / "agentd"
SPINNER = """
import ctypes, os, time
ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
count, report = 0, time.monotonic() + 1
while True:
    for _ in range(20000):
        count += 1
    now = time.monotonic()
    if now >= report:
        print(count, flush=True)
        count, report = 0, report + 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rates:
    """The spinner's per-second counts, read from its stdout in a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.samples: list[tuple[float, int]] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.samples.append((time.monotonic(), int(line)))

    def mean_between(self, start: float, end: float) -> float:
        return statistics.mean(n for t, n in self.samples if start + 1 < t <= end)


def wait_for_rank(stub: pb_grpc.AgentStub, pid: int) -> None:
    for snapshot in stub.Watch(pb.WatchRequest(), timeout=60):
        if any(r.pid == pid for r in snapshot.ranks):
            return
    raise RuntimeError(f"agentd never reported rank {pid}")


def phase(rates: Rates, seconds: float, loops: int, action=None) -> tuple[float, int]:
    stop = threading.Event()
    counters: list[list[int]] = []
    if action is not None:
        counters = [_one_loop(stop, action) for _ in range(loops)]
    start = time.monotonic()
    time.sleep(seconds)
    stop.set()
    return rates.mean_between(start, time.monotonic()), sum(c[0] for c in counters)


def _one_loop(stop: threading.Event, action) -> list[int]:
    done = [0]

    def run() -> None:
        while not stop.is_set():
            action()
            done[0] += 1

    threading.Thread(target=run, daemon=True).start()
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--loops", type=int, default=4)
    args = parser.parse_args()
    binary = pyspy.find_pyspy()
    port, metrics_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        agent = subprocess.Popen([str(AGENTD), "--interval-ms", "200", "--port", str(port),
                                  "--metrics-port", str(metrics_port), "--trace-dir", f"{tmp}/traces"],
                                 stderr=subprocess.DEVNULL)
        env = launch_environment(dict(os.environ), kineto_daemon=False)
        rank = subprocess.Popen([sys.executable, "-c", SPINNER], env=env, stdout=subprocess.PIPE, text=True)
        try:
            rates = Rates(rank)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                grpc.channel_ready_future(channel).result(timeout=60)
                stub = pb_grpc.AgentStub(channel)
                wait_for_rank(stub, rank.pid)
                request = pb.GetStacksRequest(take_now=True, native=True, pids=[rank.pid])

                def get_stacks() -> None:
                    stub.GetStacks(request, timeout=120)

                def direct_dump() -> None:
                    pyspy.dump(binary, rank.pid, None, native=True)

                quiet1, _ = phase(rates, args.phase_s, args.loops)
                agent_rate, agent_calls = phase(rates, args.phase_s, args.loops, get_stacks)
                quiet2, _ = phase(rates, args.phase_s, args.loops)
                direct_rate, direct_calls = phase(rates, args.phase_s, args.loops, direct_dump)
                quiet3, _ = phase(rates, args.phase_s, args.loops)
        finally:
            rank.kill()
            agent.terminate()
            agent.wait(10)
    # Each loaded phase against the mean of the quiet phases on either side (the host is shared).
    agent_quiet, direct_quiet = (quiet1 + quiet2) / 2, (quiet2 + quiet3) / 2
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; py-spy {pyspy.pyspy_version(binary)}")
    print(f"limiter: MAX_DUTY {MAX_DUTY:.0%}, MIN_GAP_SECONDS {MIN_GAP_SECONDS:g}; phases of {args.phase_s:g} s, "
          f"{args.loops} loops")
    print("| phase | rank iterations/s | loss | calls made |")
    print("|---|---|---|---|")
    print(f"| quiet (1st) | {quiet1:,.0f} | | |")
    print(f"| {args.loops} × GetStacks(native) through agentd | {agent_rate:,.0f} | "
          f"{1 - agent_rate / agent_quiet:.1%} | {agent_calls} |")
    print(f"| quiet (2nd) | {quiet2:,.0f} | | |")
    print(f"| {args.loops} × `py-spy dump --native` back to back (each request, before) | {direct_rate:,.0f} | "
          f"{1 - direct_rate / direct_quiet:.1%} | {direct_calls} (most refused at once: the rank was "
          "already stopped by another py-spy) |")
    print(f"| quiet (3rd) | {quiet3:,.0f} | | |")


if __name__ == "__main__":
    main()
