"""Console at fleet scale: N simulated agents, one headless console connected to all of them.

    .venv/bin/python bench/console/console_fleet.py --counts 64 256 1024 --seconds 20

Two processes. The *fleet* serves N agent endpoints (one gRPC server, N listening
ports on 127.0.0.1) with real ``Watch`` streams at 1 s: realistic snapshots of
8 GPUs and 8 ranks each (the synthetic values of tests/console/gpu_fixture.py),
stamped with the send time. The *console* is the real ``TuiprofApp`` running
headless (``App.run_test`` at 200×60) over a ``LiveSource`` of those N addresses,
i.e. the same client, model and cluster view as ``tuiprof connect``. Measured in
the console process only, after a warm-up:

- CPU: process CPU seconds per wall second;
- RSS at the end;
- send → arrival: agent's snapshot timestamp to the client callback;
- arrival → on screen, for hosts whose row was on screen when the snapshot
  arrived: client callback to the first frame painted after the cluster view
  took that snapshot in (``call_after_refresh`` after the view's refresh),
  p50/p99. A snapshot of a host scrolled out of view is never "on screen"; it
  only updates the model, and the view redraws for it at the slow pace;
- arrival → next frame, for every snapshot (the definition of runs 1–3 in
  console_fleet.md, which did not tell on-screen hosts from the rest);
- key latency: ``j`` (cursor down) pressed through the Pilot until the frame
  showing the moved cursor is painted.

The machine is shared and has 2 cores; the fleet process competes with the
console for them, so these are upper bounds for the console's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

import grpc  # noqa: E402
import psutil  # noqa: E402

from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc  # noqa: E402
from console.gpu_fixture import gpu_info, gpu_snapshot  # noqa: E402

INTERVAL_S = 1.0
VARIANTS = 16


# ---------------------------------------------------------------- the fleet


class SimulatedAgent(pb_grpc.AgentServicer):
    """Every endpoint answers alike: fixed info, a snapshot per interval stamped now."""

    def __init__(self) -> None:
        self._info = gpu_info("sim")
        # One hostname for all: the servicer cannot tell which port a call came in on,
        # and a host's name must not change between its snapshots.
        self._variants = [gpu_snapshot("sim", i % 4, i) for i in range(VARIANTS)]
        self._streams = 0

    async def GetInfo(self, request, context):
        return self._info

    async def Watch(self, request, context):
        self._streams += 1
        variant = self._streams % VARIANTS
        sequence = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            message = pb.HostSnapshot()
            message.CopyFrom(self._variants[variant])
            sequence += 1
            message.sequence = sequence
            message.timestamp_unix_ns = time.time_ns()
            yield message
            variant = (variant + 1) % VARIANTS
            deadline += INTERVAL_S
            await asyncio.sleep(max(0.0, deadline - loop.time()))


async def serve(count: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_AgentServicer_to_server(SimulatedAgent(), server)
    ports = [server.add_insecure_port("127.0.0.1:0") for _ in range(count)]
    await server.start()
    print(json.dumps(ports), flush=True)
    await server.wait_for_termination()


# ---------------------------------------------------------------- the console


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(ports: list[int], seconds: float, warmup: float) -> dict[str, float]:
    from agentd.address import AgentAddress
    from tuiprof.client.host_client import ConnectionOptions
    from tuiprof.client.sources import LiveSource
    from tuiprof.model.events import SnapshotReceived
    from tuiprof.tui.app import TuiprofApp

    arrivals: list[tuple[float, float, bool]] = []  # (sent, arrived, row on screen) not yet rendered
    transit: list[float] = []
    next_frame: list[float] = []
    on_screen: list[float] = []
    measuring = False

    class MeasuredApp(TuiprofApp):
        def _receive(self, event) -> None:
            if measuring and isinstance(event, SnapshotReceived):
                shown = self.screen.shows(event.host)
                arrivals.append((event.message.timestamp_unix_ns / 1e9, event.at, shown))
            super()._receive(event)

        def render_views(self, force: bool = False) -> None:
            # Only snapshots already applied to the cluster reach this render.
            taken = [a for a in arrivals if a[1] <= self._applied_until]
            del arrivals[: len(taken)]
            super().render_views(force)
            def painted() -> None:
                now = time.time()
                next_frame.extend(now - at for _, at, _ in taken)
                on_screen.extend(now - at for _, at, shown in taken if shown)

            self.call_after_refresh(painted)
            transit.extend(at - sent for sent, at, _ in taken)

        def on_events_pending(self, message) -> None:
            self._applied_until = time.time()
            super().on_events_pending(message)

    addresses = [AgentAddress("127.0.0.1", port) for port in ports]
    app = MeasuredApp(LiveSource(addresses, ConnectionOptions(interval_ms=1000)))
    app._applied_until = 0.0
    process = psutil.Process()
    keys: list[float] = []
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause(warmup)
        screen = app.screen
        moved = screen.action_cursor
        painted: list[float] = []

        def cursor_then_paint(step: int) -> None:
            moved(step)
            app.call_after_refresh(lambda: painted.append(time.perf_counter()))

        screen.action_cursor = cursor_then_paint
        up = sum(1 for h in app.cluster.hosts() if h.reachable)
        measuring = True
        cpu0, wall0 = process.cpu_times(), time.monotonic()
        end = wall0 + seconds
        while time.monotonic() < end:
            await asyncio.sleep(0.5)
            count, start = len(painted), time.perf_counter()
            asyncio.ensure_future(pilot.press("j"))
            while len(painted) == count and time.perf_counter() - start < 10:
                await asyncio.sleep(0.001)
            keys.append(painted[-1] - start if len(painted) > count else float("inf"))
        cpu1, wall1 = process.cpu_times(), time.monotonic()
        measuring = False
        rss = process.memory_info().rss
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (wall1 - wall0)
    return {
        "hosts": len(ports), "hosts_up_after_warmup": up, "seconds": round(wall1 - wall0, 1),
        "snapshots": len(next_frame), "snapshots_of_rows_on_screen": len(on_screen),
        "cpu_cores": round(cpu, 3), "rss_mib": round(rss / 2**20, 1),
        "send_to_arrival_p50_ms": round(1e3 * percentile(transit, 0.5), 1),
        "send_to_arrival_p99_ms": round(1e3 * percentile(transit, 0.99), 1),
        "arrival_to_screen_p50_ms": round(1e3 * percentile(on_screen, 0.5), 1),
        "arrival_to_screen_p99_ms": round(1e3 * percentile(on_screen, 0.99), 1),
        "arrival_to_next_frame_p50_ms": round(1e3 * percentile(next_frame, 0.5), 1),
        "arrival_to_next_frame_p99_ms": round(1e3 * percentile(next_frame, 0.99), 1),
        "key_p50_ms": round(1e3 * statistics.median(keys), 1),
        "key_p99_ms": round(1e3 * percentile(keys, 0.99), 1),
    }


def run_one(count: int, seconds: float, warmup: float) -> dict[str, float]:
    fleet = subprocess.Popen([sys.executable, __file__, "--serve", str(count)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert fleet.stdout is not None
        ports = json.loads(fleet.stdout.readline())
        console = subprocess.run(
            [sys.executable, __file__, "--console", json.dumps(ports), "--seconds", str(seconds),
             "--warmup", str(warmup)],
            capture_output=True, text=True, timeout=seconds + warmup + 300,
        )
        if console.returncode != 0:
            raise RuntimeError(console.stderr)
        return json.loads(console.stdout.strip().splitlines()[-1])
    finally:
        fleet.terminate()
        fleet.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--console", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
    elif args.console:
        ports = json.loads(args.console)
        print(json.dumps(asyncio.run(measure(ports, args.seconds, args.warmup))))
    else:
        print(f"# {os.uname().nodename}: {psutil.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        for count in args.counts:
            print(json.dumps(run_one(count, args.seconds, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
