"""The console's own share of a Prometheus refresh at fleet scale, without a Prometheus.

    .venv/bin/python bench/console_prometheus_answer.py --hosts 10000 --refreshes 10 [--source DIR]

The real ``PrometheusSource.refresh`` (``PrometheusClient``, its decoding, the rows, the
events) over an HTTP transport that answers each column's query at once with the body a
Prometheus with the recording rules would send for N hosts (one sample per host, every
host's snapshot new at every refresh, so every row changes), then the real headless
``TuiprofApp`` (200×60) taking the events in and redrawing the cluster view. Per refresh:
the time in the source (decode, rows, events), in the app applying the events, and in the
cluster view's redraw, p50 and max over ``--refreshes`` after one warm-up refresh.
``--source DIR`` runs another tree's ``tuiprof`` (e.g. an older commit unpacked with
``git archive``) for a before/after on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.parse


def answer(column: str, hosts: int, value_at: float, now: float) -> bytes:
    """What Prometheus sends for one column: a vector of one sample per host."""
    samples = []
    for i in range(hosts):
        labels = {"hostname": f"gpu-node-{i:05d}"}
        if column == "collectors_down":
            break  # every collector up: an empty vector
        if column == "hang":
            labels["level"] = "ok"
            value = "1"
        elif column == "sampled_at":
            value = repr(value_at)
        elif column in ("gpu_count", "rank_count"):
            value = "8"
        else:
            value = f"{(i % 100) + 0.5}"
        samples.append({"metric": labels, "value": [now, value]})
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": samples}}).encode()


async def measure(hosts: int, refreshes: int) -> dict[str, object]:
    import httpx

    from tuiprof.client import prometheus
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.tui.app import TuiprofApp

    queries = prometheus.column_queries(prometheus.HostSelection(), recorded=True)
    column_of = {query: column for column, query in queries.items()}
    probe = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                      "result": [{"metric": {}, "value": [0, str(hosts)]}]}}).encode()
    sampled = [time.time()]
    bodies: dict[tuple[str, float], bytes] = {}

    def reply(request: httpx.Request) -> httpx.Response:
        query = urllib.parse.parse_qs(request.content.decode())["query"][0]
        if query == prometheus.RULES_PROBE:
            return httpx.Response(200, content=probe)
        key = (column_of[query], sampled[0])
        if key not in bodies:
            bodies[key] = answer(key[0], hosts, sampled[0], time.time())
        return httpx.Response(200, content=bodies[key])

    source = prometheus.PrometheusSource("http://prometheus.test", prometheus.HostSelection(), ConnectionOptions(),
                                         agent_port=1779)
    client = prometheus.PrometheusClient(source.url)
    client._http = httpx.AsyncClient(base_url=source.url, transport=httpx.MockTransport(reply))

    async def idle(_emit: object) -> None:  # refreshes are driven below, one at a time
        await asyncio.Event().wait()

    source.run = idle  # type: ignore[method-assign]
    app = TuiprofApp(source)
    parts: dict[str, list[float]] = {"source_s": [], "apply_s": [], "redraw_s": []}
    async with app.run_test(size=(200, 60)) as pilot:
        for index in range(refreshes + 1):
            sampled[0] += 15.0
            for column in queries:  # the answers are built before the clock starts: they are the server's work
                bodies[(column, sampled[0])] = answer(column, hosts, sampled[0], time.time())
            events: list[object] = []
            started = time.perf_counter()
            await source.refresh(client, events.append)
            fetched = time.perf_counter()
            app._inbox = events  # type: ignore[assignment]
            app.on_events_pending(None)  # type: ignore[arg-type]
            applied = time.perf_counter()
            app.render_views(force=True)
            drawn = time.perf_counter()
            if index:  # the first refresh builds every row: a warm-up
                parts["source_s"].append(fetched - started)
                parts["apply_s"].append(applied - fetched)
                parts["redraw_s"].append(drawn - applied)
            assert len(events) == hosts, f"{len(events)} events for {hosts} hosts"
            bodies.clear()
            await pilot.pause(0.3)
    await client.__aexit__()
    result: dict[str, object] = {"hosts": hosts, "refreshes": refreshes}
    for name, values in parts.items():
        result[f"{name[:-2]}_p50_ms"] = round(1e3 * statistics.median(values))
        result[f"{name[:-2]}_max_ms"] = round(1e3 * max(values))
    total = [sum(p) for p in zip(*parts.values())]
    result["total_p50_ms"], result["total_max_ms"] = round(1e3 * statistics.median(total)), round(1e3 * max(total))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--source", help="the tree whose tuiprof to measure (default: this one)")
    args = parser.parse_args()
    if args.source:
        sys.path.insert(0, os.path.abspath(args.source))
    print(json.dumps(asyncio.run(measure(args.hosts, args.refreshes))))


if __name__ == "__main__":
    main()
