"""10,000 hosts in a real Prometheus: the fleet view returns every row, and the console shows them.

The TSDB is backfilled with ``promtool tsdb create-blocks-from openmetrics``: 10,000
hosts × the series the cluster view reads (one GPU and one rank each, two samples a
few seconds apart, ending now), then Prometheus starts on it. Figures at this scale
(CPU, memory, time to rows) are in bench/console/console_prometheus.md, not asserted here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from console.prometheus_server import PROMETHEUS, PROMTOOL, backfill, fleet_openmetrics, node_name, running_prometheus
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.prometheus import (
    FleetView, HostSelection, PrometheusClient, PrometheusSource, column_queries, fetch_fleet,
)

HOSTS = 10_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("scale")
    now = time.time()
    backfill(directory / "tsdb", fleet_openmetrics(HOSTS, gpus=1, at=[now - 10, now]), directory)
    with running_prometheus(directory, storage=directory / "tsdb") as url:
        yield url


def fetch(prometheus: str, guess: bool) -> tuple[int, FleetView]:
    """One fleet view (the columns read first in the ``guess`` mode), and how many queries it took."""
    async def one() -> tuple[int, FleetView]:
        async with PrometheusClient(prometheus) as client:
            view = await fetch_fleet(client, HostSelection(), guess=guess)
            return client.queries_sent, view
    return asyncio.run(one())


def test_ten_thousand_rows_from_one_query_per_column(prometheus: str) -> None:
    queries, view = fetch(prometheus, guess=False)
    rows = view.rows
    assert len(rows) == HOSTS
    assert set(rows) == {node_name(i) for i in range(HOSTS)}
    for i in (0, 1, 4242, HOSTS - 1):
        summary = rows[node_name(i)].summary
        utilization = 0.0 if i % 7 == 0 else i % 100
        assert summary.gpu_util_mean == pytest.approx(utilization) and summary.gpu_util_min == pytest.approx(utilization)
        assert summary.gpu_count == 1 and summary.power_watts == 300.0 and summary.cpu_percent == 25.0
        assert summary.memory_percent == 25.0 and summary.step_time_seconds == 0.5 and summary.hang_level == "ok"
        assert summary.sm_active_min == pytest.approx(utilization / 2)
        assert summary.gpu_memory_used_bytes == 40 * 2**30 and summary.gpu_memory_total_bytes == 80 * 2**30
        assert isinstance(summary.nccl_busbw_bytes_per_s, float)
    # per column, not per host; + time, rules loaded?, slow jobs
    assert queries == len(column_queries(HostSelection())) + 3


def test_without_the_rules_a_guess_of_them_reads_the_columns_again(prometheus: str) -> None:
    """A console's first refresh guesses the rules are loaded; here they are not: the probe sent
    with the recorded columns says so, and the raw columns are read."""
    queries, view = fetch(prometheus, guess=True)
    assert not view.recorded and len(view.rows) == HOSTS
    # twice the columns and the time; the probe; the slow jobs
    assert queries == 2 * len(column_queries(HostSelection())) + 4


async def test_console_shows_ten_thousand_hosts(prometheus: str) -> None:
    from tuiprof.tui.app import TuiprofApp

    # no staleness here: the test's own pace must not age the backfilled samples into "stale"
    source = PrometheusSource(prometheus, HostSelection(), ConnectionOptions(), agent_port=1779,
                              refresh_s=60.0, stale_after_s=3600.0)
    app = TuiprofApp(source)
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = time.monotonic() + 60
        while sum(1 for h in app.cluster.hosts() if h.reachable) < HOSTS:
            assert time.monotonic() < deadline, f"{len(app.cluster.hosts())} hosts known"
            await pilot.pause(0.2)
        app.render_views(force=True)
        await pilot.pause()
        assert str(app.screen.sub_title).startswith(f"{HOSTS}/{HOSTS} hosts up")
        assert len(app.screen.grid.keys) == HOSTS  # type: ignore[attr-defined]
