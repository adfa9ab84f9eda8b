"""Console in Prometheus mode at fleet scale, beside the direct gRPC mode.

    .venv/bin/python bench/console/console_prometheus.py --counts 1000 10000 --seconds 60 --grpc 1024

For each N: a real Prometheus (Debian's) started on a TSDB backfilled with
``promtool tsdb create-blocks-from openmetrics``: N hosts × 8 GPUs × 8 ranks, the
series the cluster view reads (tests/console/prometheus_server.py, the names and
labels agentd exports), one sample every ``--step`` seconds (the scrape interval)
while the runs last, as if scraped, so each new sample is a new snapshot of its host.
The hosts' samples are spread over the step, as Prometheus spreads its targets' scrapes
over the interval: at a 5 s refresh and a 15 s step a third of the rows change at each
refresh (``--aligned``: every host sampled at the same moment, so every row changes at
one refresh in three, as in runs 1-3 of bench/console/console_prometheus.md). Each N is measured
twice on the same data: Prometheus without and with the recording rules of
docs/prometheus/tuiprof-rules.yml (evaluated every step). The console is the real ``TuiprofApp`` headless (200×60) over a
``PrometheusSource`` refreshing every ``--refresh`` seconds, in its own process.
Measured over ``--seconds`` after a warm-up:

- console CPU (process CPU seconds per wall second) and RSS at the end;
- refresh → rows on screen: from the start of a refresh (its queries sent) to the
  first frame painted after the cluster view took in that refresh's rows, p50/p99,
  over the refreshes that brought new rows (the others change nothing on screen);
- Prometheus query time per refresh (all columns, in parallel, answers read), p50/p99,
  and the Prometheus server's own CPU and RSS over the same window.

``--grpc N`` also runs bench/console/console_fleet.py's direct mode (N simulated agents, one
stream each) in the same run, for the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

from console.prometheus_server import (  # noqa: E402
    RECORDING_RULES, backfill, fleet_openmetrics, running_prometheus,
)

GPUS = 8
BACKFILL_S_PER_HOST = 0.015
"""About how long the backfill takes per host of 8 GPUs on the 2-core VM (10,000 hosts: ~2.5 min);
less is harmless (the first samples are then in the past), more leaves the runs without new ones."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(url: str, refresh: float, seconds: float, warmup: float, prometheus_pid: int) -> dict:
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.prometheus import HostSelection, PrometheusSource
    from tuiprof.tui.app import TuiprofApp

    started: list[float] = []  # refreshes whose rows are in the inbox, not yet applied
    applied: list[float] = []  # applied to the cluster, not yet painted
    to_screen: list[float] = []
    query_s: list[float] = []
    measuring = False

    class MeasuredSource(PrometheusSource):
        async def refresh(self, client, emit) -> None:
            begun, emitted = time.perf_counter(), []

            def counted(event) -> None:
                emitted.append(event)
                emit(event)

            await super().refresh(client, counted)
            if measuring and self.last_view is not None:
                query_s.append(self.last_view.query_seconds)
                if emitted:  # a refresh with no new snapshot changes nothing on screen
                    started.append(begun)

    class MeasuredApp(TuiprofApp):
        def on_events_pending(self, message) -> None:
            applied.extend(started)
            started.clear()
            super().on_events_pending(message)

        def render_views(self, force: bool = False) -> None:
            taken = list(applied)
            applied.clear()
            super().render_views(force)
            if taken:
                self.call_after_refresh(lambda: to_screen.extend(time.perf_counter() - t for t in taken))

    source = MeasuredSource(url, HostSelection(), ConnectionOptions(), agent_port=1779, refresh_s=refresh)
    app = MeasuredApp(source)
    process, server = psutil.Process(), psutil.Process(prometheus_pid)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause(warmup)
        hosts_up = sum(1 for h in app.cluster.hosts() if h.reachable)
        measuring = True
        cpu0, server0, wall0 = process.cpu_times(), server.cpu_times(), time.monotonic()
        await pilot.pause(seconds)
        cpu1, server1, wall1 = process.cpu_times(), server.cpu_times(), time.monotonic()
        measuring = False
        rss, server_rss = process.memory_info().rss, server.memory_info().rss
    wall = wall1 - wall0
    return {
        "recording_rules": source.last_view is not None and source.last_view.recorded, "hosts_up_after_warmup": hosts_up, "seconds": round(wall, 1),
        "refreshes": len(query_s), "refreshes_with_new_rows": len(to_screen),
        "console_cpu_cores": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall, 3),
        "console_rss_mib": round(rss / 2**20, 1),
        "refresh_to_screen_p50_ms": round(1e3 * percentile(to_screen, 0.5)),
        "refresh_to_screen_p99_ms": round(1e3 * percentile(to_screen, 0.99)),
        "query_p50_ms": round(1e3 * percentile(query_s, 0.5)),
        "query_p99_ms": round(1e3 * percentile(query_s, 0.99)),
        "prometheus_cpu_cores": round((server1.user + server1.system - server0.user - server0.system) / wall, 3),
        "prometheus_rss_mib": round(server_rss / 2**20, 1),
    }


def run_one(count: int, seconds: float, warmup: float, refresh: float, step: float,
            backfill_s_per_host: float = BACKFILL_S_PER_HOST, rules_only: bool = False,
            aligned: bool = False) -> list[dict]:
    """Backfill once; measure the console over Prometheus without (unless ``rules_only``), then
    with, the recording rules."""
    rule_sets: tuple[tuple[pathlib.Path, ...], ...] = ((RECORDING_RULES,),) if rules_only else ((), (RECORDING_RULES,))
    results = []
    with tempfile.TemporaryDirectory(prefix="tuiprof-bench-prom-") as work:
        directory = pathlib.Path(work)
        # One sample now (every host has a row at once), then one per step from about when the
        # backfill will be done (backfill_s_per_host) until both runs are over: the samples
        # written are those the runs read, however long the backfill takes.
        now = time.time()
        first = now + backfill_s_per_host * count
        samples = int((len(rule_sets) * (warmup + seconds) + 180) / step)
        times = [now - step, *(first + i * step for i in range(samples))]
        begun = time.monotonic()
        backfill(directory / "tsdb", fleet_openmetrics(count, gpus=GPUS, at=times, spread_s=0.0 if aligned else step),
                 directory)
        backfill_s = time.monotonic() - begun
        for rules in rule_sets:
            with running_prometheus(directory, storage=directory / "tsdb", scrape_interval=f"{step:g}s",
                                    rule_files=rules, out_of_order_window="1h") as url:
                pid = next(p.pid for p in psutil.Process().children() if p.name() == "prometheus")
                console = subprocess.run(
                    [sys.executable, __file__, "--console", url, "--prometheus-pid", str(pid),
                     "--seconds", str(seconds), "--warmup", str(warmup), "--refresh", str(refresh)],
                    capture_output=True, text=True, timeout=seconds + warmup + 300,
                )
            if console.returncode != 0:
                raise RuntimeError(console.stderr)
            result = json.loads(console.stdout.strip().splitlines()[-1])
            results.append({"mode": "prometheus", "hosts": count, "gpus": count * GPUS, "aligned": aligned,
                            "samples_per_series": len(times), "backfill_s": round(backfill_s, 1), **result})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--refresh", type=float, default=5.0, help="console refresh (s)")
    parser.add_argument("--step", type=float, default=15.0,
                        help="seconds between backfilled samples (the scrape interval; also the rules' evaluation)")
    parser.add_argument("--grpc", type=int, default=0, help="also run direct gRPC mode with this many agents")
    parser.add_argument("--rules-only", action="store_true", help="measure only with the recording rules loaded")
    parser.add_argument("--aligned", action="store_true",
                        help="every host sampled at the same moment (runs 1-3), not spread over the step")
    parser.add_argument("--backfill-s-per-host", type=float, default=BACKFILL_S_PER_HOST,
                        help="about how long the backfill takes per host here (the first live sample's delay)")
    parser.add_argument("--console", help=argparse.SUPPRESS)
    parser.add_argument("--prometheus-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.console:
        print(json.dumps(asyncio.run(measure(args.console, args.refresh, args.seconds, args.warmup,
                                             args.prometheus_pid))))
        return
    print(f"# {os.uname().nodename}: {psutil.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for count in args.counts:
        for result in run_one(count, args.seconds, args.warmup, args.refresh, args.step, args.backfill_s_per_host,
                              args.rules_only, args.aligned):
            print(json.dumps(result), flush=True)
    if args.grpc:
        import console_fleet

        direct = console_fleet.run_one(args.grpc, args.seconds, args.warmup)
        print(json.dumps({"mode": "grpc", **direct}), flush=True)
    print(f"# load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
