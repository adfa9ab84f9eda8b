"""The console's own share of a Prometheus refresh at fleet scale, without a Prometheus.

    .venv/bin/python bench/console/console_prometheus_answer.py --hosts 10000 --refreshes 10 [--source DIR]
    .venv/bin/python bench/console/console_prometheus_answer.py --hosts 10000 --new-every 3 --server-ms 460 --probe-ms 80

The real ``PrometheusSource.refresh`` (``PrometheusClient``, its decoding, the rows, the
events) over an HTTP transport that answers each column's query with the body a
Prometheus with the recording rules would send for N hosts (one sample per host), then
the real headless ``TuiprofApp`` (200×60) taking the events in and redrawing the cluster
view. Per refresh: the time in the source (queries, decode, rows, events), in the app
applying the events, and in the cluster view's redraw, p50 and max over ``--refreshes``
after one warm-up refresh. ``--source DIR`` runs another tree's ``tuiprof`` (e.g. an older
commit unpacked with ``git archive``) for a before/after on the same machine.

By default every answer comes at once and every host's snapshot is new at every refresh
(the console's work alone, every row changing). ``--new-every K``: each host's snapshot is
new at one refresh in K, a different third of the hosts each time for K=3 (a 15 s scrape,
staggered over the hosts as Prometheus does, read every 5 s). ``--server-ms T``: the server's
time, modelled: each column's answer comes T×(k+1)/n ms after its query is sent, k its
position among the n columns (Prometheus evaluating them in parallel, each answer ready at
its own time, the last after T: the query time measured on the GPU machine was 0.46-0.49 s
p50, bench/console/console_prometheus.md); ``--probe-ms``: the same for the rules probe (a count
over every host's recorded series, ~80 ms measured).
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


def answer(column: str, sampled: list[float], now: float) -> bytes:
    """What Prometheus sends for one column: a vector of one sample per host (``sampled``:
    each host's snapshot time)."""
    samples = []
    for i, sampled_at in enumerate(sampled):
        labels = {"hostname": f"gpu-node-{i:05d}"}
        if column == "collectors_down":
            break  # every collector up: an empty vector
        if column == "hang":
            labels["level"] = "ok"
            value = "1"
        elif column == "sampled_at":
            value = repr(sampled_at)
        elif column in ("gpu_count", "rank_count"):
            value = "8"
        else:
            value = f"{(i % 100) + 0.5}"
        samples.append({"metric": labels, "value": [now, value]})
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": samples}}).encode()


async def measure(hosts: int, refreshes: int, new_every: int, server_ms: float, probe_ms: float) -> dict[str, object]:
    import httpx

    from tuiprof.client import prometheus
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.tui.app import TuiprofApp

    queries = prometheus.column_queries(prometheus.HostSelection(), recorded=True)
    column_of = {query: column for column, query in queries.items()}
    delay_s = {query: server_ms * (k + 1) / len(queries) / 1e3 for k, query in enumerate(queries.values())}
    delay_s[prometheus.RULES_PROBE] = probe_ms / 1e3
    probe = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                      "result": [{"metric": {}, "value": [0, str(hosts)]}]}}).encode()
    sampled = [time.time()] * hosts
    # the figures stay the same (the console's work does not depend on them); the snapshot times move
    bodies = {column: answer(column, sampled, time.time()) for column in queries}

    async def reply(request: httpx.Request) -> httpx.Response:
        query = urllib.parse.parse_qs(request.content.decode())["query"][0]
        await asyncio.sleep(delay_s[query])
        return httpx.Response(200, content=probe if query == prometheus.RULES_PROBE else bodies[column_of[query]])

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
            new = [i for i in range(hosts) if not index or i % new_every == index % new_every]
            for i in new:
                sampled[i] += 15.0
            # the answer is built before the clock starts: it is the server's work
            bodies["sampled_at"] = answer("sampled_at", sampled, time.time())
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
            assert len(events) == len(new), f"{len(events)} events for {len(new)} new snapshots"
            await pilot.pause(0.3)
    await client.__aexit__()
    result: dict[str, object] = {"hosts": hosts, "refreshes": refreshes, "new_every": new_every,
                                 "server_ms": server_ms, "probe_ms": probe_ms}
    for name, values in parts.items():
        result[f"{name[:-2]}_p50_ms"] = round(1e3 * statistics.median(values))
        result[f"{name[:-2]}_max_ms"] = round(1e3 * max(values))
    total = [sum(p) for p in zip(*parts.values(), strict=True)]
    result["total_p50_ms"], result["total_max_ms"] = round(1e3 * statistics.median(total)), round(1e3 * max(total))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--new-every", type=int, default=1, help="each host's snapshot is new at one refresh in K")
    parser.add_argument("--server-ms", type=float, default=0.0,
                        help="the last column's answer comes this long after its query (the others spread before)")
    parser.add_argument("--probe-ms", type=float, default=0.0, help="the rules probe's answer comes this long after")
    parser.add_argument("--source", help="the tree whose tuiprof to measure (default: this one)")
    args = parser.parse_args()
    if args.source:
        sys.path.insert(0, os.path.abspath(args.source))
    print(json.dumps(asyncio.run(measure(args.hosts, args.refreshes, args.new_every, args.server_ms,
                                         args.probe_ms))))


if __name__ == "__main__":
    main()
