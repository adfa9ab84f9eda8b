"""With the recording rules loaded, a row's figures and its time come from one rule evaluation.

A real Prometheus scrapes, every second, an agent that takes a new snapshot at every scrape
(agentd's own exposition of the golden snapshot, its CPU and memory figures a function of
the snapshot's time), and evaluates docs/prometheus/tuiprof-rules.yml every 4 s: most of
the time the newest snapshot scraped is newer than the one the rules last recorded.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from collections.abc import Iterator

import pytest
from google.protobuf import text_format

from agentd.proto import tuiprof_agent_pb2 as pb
from console.prometheus_server import PROMETHEUS, RECORDING_RULES, running_prometheus, ticking_agent
from testkit.ports import free_port
from tuiprof.client.prometheus import (
    FIGURES, NOT_RECORDED_YET, SETTLED_AFTER_S, FleetView, HostSelection, PrometheusClient, fetch_fleet, recording_rules_loaded,
)

HOSTNAME = "ticking-node"
GOLDEN = pathlib.Path(__file__).parents[1] / "agent" / "data" / "metrics.golden.snapshot.txtpb"
SELECTION = HostSelection.matching(HOSTNAME)
TIMEOUT_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt package prometheus)"),
]


def idle_percent(second: int) -> float:
    return 10.0 + second % 80


def memory_used_bytes(second: int) -> float:
    return (1 + second % 1000) * 2.0**20


def snapshot_at(now: float) -> pb.HostSnapshot:
    """The golden snapshot taken at ``now``'s whole second, with figures telling that second."""
    snapshot = text_format.Parse(GOLDEN.read_text(), pb.HostSnapshot())
    second = int(now)
    snapshot.hostname = HOSTNAME
    snapshot.timestamp_unix_ns = second * 10**9
    snapshot.cpu.idle_percent = idle_percent(second)
    snapshot.memory.used_bytes = int(memory_used_bytes(second))
    return snapshot


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    """A file_sd target file naming the ticking agent."""
    directory = tmp_path_factory.mktemp("ticking")
    port = free_port()
    path = directory / "targets.json"
    path.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"]}]))
    with ticking_agent("127.0.0.1", port, snapshot_at):
        yield path


def fetch(url: str, recorded: bool | None, selection: HostSelection = SELECTION) -> FleetView:
    async def one() -> FleetView:
        async with PrometheusClient(url) as client:
            return await fetch_fleet(client, selection, recorded=recorded)
    return asyncio.run(one())


def wait_for(url: str, promql: str) -> None:
    """Until ``promql`` answers a sample (the rules evaluated over a scrape), and that sample is
    older than the moment a refresh's columns are evaluated at (``SETTLED_AFTER_S`` back)."""
    async def answered() -> bool:
        async with PrometheusClient(url) as client:
            return bool((await client.query(promql)).samples)
    deadline = time.monotonic() + TIMEOUT_S
    while not asyncio.run(answered()):
        assert time.monotonic() < deadline, f"no answer to {promql} in {TIMEOUT_S:g} s"
        time.sleep(0.3)
    time.sleep(SETTLED_AFTER_S)


def assert_figures_of_their_time(view: FleetView) -> float:
    """The row's figures are those of the snapshot its time says; returns that time."""
    row = view.rows[HOSTNAME]
    second = int(row.sampled_at)
    assert row.sampled_at == second
    assert row.summary.cpu_percent == pytest.approx(100.0 - idle_percent(second)), row
    assert row.summary.memory_used_bytes == memory_used_bytes(second), row
    return row.sampled_at


def test_a_recorded_row_has_the_figures_and_the_time_of_one_evaluation(
        targets: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with running_prometheus(tmp_path, file_sd=targets, scrape_interval="1s", evaluation_interval="4s",
                            rule_files=[RECORDING_RULES]) as url:
        wait_for(url, FIGURES["sampled_at"].recorded)
        newer_scraped = 0  # refreshes where the newest snapshot scraped was newer than the row's
        deadline = time.monotonic() + TIMEOUT_S
        while newer_scraped < 3:
            assert time.monotonic() < deadline, f"the raw snapshot was newer than the recorded {newer_scraped} times"
            recorded = fetch(url, recorded=True)
            assert recorded.recorded
            row_time = assert_figures_of_their_time(recorded)
            newest = fetch(url, recorded=False).rows[HOSTNAME].sampled_at
            assert newest >= row_time
            newer_scraped += newest > row_time
            time.sleep(0.4)


def test_rules_without_the_row_time_count_as_not_loaded(targets: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """An older rules file records the figures but not their time: the console reads the raw
    series (rows with their time), not recorded figures with no time to show."""
    lines = RECORDING_RULES.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if f"record: {FIGURES['sampled_at'].recorded}" in line)
    older = tmp_path / "tuiprof-rules-older.yml"
    older.write_text("".join(lines[:at] + lines[at + 2:]))
    with running_prometheus(tmp_path, file_sd=targets, scrape_interval="1s", rule_files=[older]) as url:
        wait_for(url, FIGURES["cpu_percent"].recorded)

        async def loaded() -> bool:
            async with PrometheusClient(url) as client:
                return await recording_rules_loaded(client)
        assert not asyncio.run(loaded())
        view = fetch(url, recorded=None)  # whichever the server has, guessed recorded first
        assert not view.recorded and set(view.rows) == {HOSTNAME}
        assert view.evaluated_at - assert_figures_of_their_time(view) < 10
        # read as recorded anyway, the host is scraped but has no recorded row: not recorded yet
        view = fetch(url, recorded=True, selection=HostSelection(expected=(HOSTNAME,)))
        assert not view.rows and view.missing == {HOSTNAME: NOT_RECORDED_YET}
