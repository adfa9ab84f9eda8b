"""The cluster view from a real Prometheus scraping real agents.

Two agentd run in their own UTS namespaces, named after the loopback address each
listens on (127.0.0.2, 127.0.0.3: a node name the console can also dial, as a
cluster's DNS would resolve it), on the same ports, as on a real fleet. A third
target is a frozen agent: agentd's own exposition of a snapshot taken long ago
(the golden snapshot, GPUs and ranks included), as an agent whose sampling stopped
while its HTTP endpoint still answers. A fourth target listens nowhere (Prometheus
cannot scrape it), a fifth node is expected but not scraped at all. Prometheus
finds the targets in a file written by ``tuiprof prometheus-targets``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from google.protobuf import text_format

from agentd.proto import tuiprof_agent_pb2 as pb
from console.prometheus_server import PROMETHEUS, RECORDING_RULES, frozen_agent, named_agent, running_prometheus
from testkit.ports import free_port
from testkit.terminal import tmux_environment
from tuiprof.cli import main
from tuiprof.commands.status import NO_FREE_TEXT, ONLY_TROUBLED
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.prometheus import (
    NOT_SCRAPED, RULES_PROBE, SERVER_TIME, FleetEvents, FleetView, HostSelection, PrometheusClient, PrometheusSource,
    QueryResult, column_queries, fetch_fleet, recording_rules_loaded,
)
from tuiprof.client.prometheus.figures import slow_jobs_query
from tuiprof.model.events import HostEvent, HostUnreachable, SummaryReceived
from tuiprof.model.messages import HangStatus
from tuiprof.model.summary import HostSummary, SlowJob, summarize
from tuiprof.analysis.slowdown import fleet_slow_banner
from tuiprof.model.values import Unavailable

NODE_A, NODE_B = "127.0.0.2", "127.0.0.3"
FROZEN = "gpu-node-07"  # the golden snapshot's hostname
UNSCRAPABLE = "127.0.0.4"  # a target where nothing listens
UNSCRAPED = "127.0.0.5"  # expected (as a SLURM job's node would be), in no target file
GOLDEN = pathlib.Path(__file__).parents[1] / "agent" / "data" / "metrics.golden.snapshot.txtpb"
ROWS_TIMEOUT_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt package prometheus)"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="naming agents needs root and unshare (UTS namespaces)"),
]


@dataclasses.dataclass
class Fleet:
    url: str
    agent_port: int
    metrics_port: int
    frozen: pb.HostSnapshot

    @property
    def selection(self) -> HostSelection:
        return HostSelection(expected=(NODE_A, NODE_B, FROZEN, UNSCRAPABLE, UNSCRAPED))

    def address(self, node: str) -> str:
        return f"{node}:{self.agent_port}"


def fetch(fleet: Fleet, selection: HostSelection | None = None, recorded: bool = False) -> tuple[FleetView, int]:
    """One refresh (from the recording rules' series if ``recorded``); also how many queries it sent."""
    async def one() -> tuple[FleetView, int]:
        async with PrometheusClient(fleet.url) as client:
            view = await fetch_fleet(client, selection or fleet.selection, recorded=recorded)
            return view, client.queries_sent
    return asyncio.run(one())


def scraped(view: FleetView) -> bool:
    """Every target scraped (or failed) once: the rows of the three that answer, the fourth
    failing; with the recording rules, the three rows recorded too."""
    return (set(view.rows) == {NODE_A, NODE_B, FROZEN}
            and view.missing.get(UNSCRAPABLE, "").startswith("Prometheus cannot scrape")
            and all(not isinstance(row.summary.cpu_percent, Unavailable) for row in view.rows.values()))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("fleet")
    port, metrics_port = free_port("0.0.0.0"), free_port("0.0.0.0")
    frozen = text_format.Parse(GOLDEN.read_text(), pb.HostSnapshot())
    targets = directory / "targets.json"
    assert main(["prometheus-targets", NODE_A, NODE_B, f"127.0.0.6:{metrics_port}", UNSCRAPABLE,
                 "--metrics-port", str(metrics_port), "--label", "cluster=test", "--output", str(targets)]) == 0
    with (named_agent(directory, NODE_A, port, metrics_port), named_agent(directory, NODE_B, port, metrics_port),
          frozen_agent("127.0.0.6", metrics_port, frozen),
          running_prometheus(directory, file_sd=targets, scrape_interval="2s", rule_files=[RECORDING_RULES]) as url):
        fleet = Fleet(url, port, metrics_port, frozen)
        deadline = time.monotonic() + ROWS_TIMEOUT_S
        while not scraped(fetch(fleet)[0]) or not scraped(fetch(fleet, recorded=True)[0]):
            assert time.monotonic() < deadline, f"Prometheus has not scraped the fleet: {fetch(fleet)[0]}"
            time.sleep(0.5)
        yield fleet


def test_the_target_file_lists_every_node_with_its_labels(fleet: Fleet, tmp_path: pathlib.Path) -> None:
    written = tmp_path / "t.json"
    assert main(["prometheus-targets", NODE_A, f"{NODE_B}:19", "--metrics-port", "9779",
                 "--label", "cluster=a", "-o", str(written)]) == 0
    assert json.loads(written.read_text()) == [{"targets": [f"{NODE_A}:9779", f"{NODE_B}:19"],
                                                "labels": {"cluster": "a"}}]
    assert oct(written.stat().st_mode & 0o777) == "0o644"


def test_live_agents_rows_come_from_prometheus_one_query_per_column(fleet: Fleet) -> None:
    view, queries = fetch(fleet, HostSelection(expected=(NODE_A, NODE_B)))
    # per column, not per host (+ the server's time, the slow jobs)
    assert queries == len(column_queries(fleet.selection)) + 2
    assert set(view.rows) == {NODE_A, NODE_B} and not view.missing
    total = psutil.virtual_memory().total
    for node in (NODE_A, NODE_B):
        summary = view.rows[node].summary
        assert isinstance(summary.cpu_percent, float) and 0.0 <= summary.cpu_percent <= 100.0
        assert isinstance(summary.memory_used_bytes, float) and 0 < summary.memory_used_bytes < total
        assert summary.memory_percent == pytest.approx(100 * summary.memory_used_bytes / total)
        # no GPU here: the GPU collector's own reason (from tuiprof_collector_up), not a zero
        assert isinstance(summary.gpu_count, Unavailable) and summary.gpu_count.reason.startswith("NVML")
        assert summary.gpu_util_mean == summary.gpu_count
        assert isinstance(summary.step_time_seconds, Unavailable)
        assert view.evaluated_at - view.rows[node].sampled_at < 10


def test_frozen_agent_is_stale_with_the_figures_the_grpc_path_gives(fleet: Fleet) -> None:
    view, _ = fetch(fleet)
    row = view.rows[FROZEN]
    assert row.sampled_at == pytest.approx(fleet.frozen.timestamp_unix_ns / 1e9)
    expected = summarize(fleet.frozen)
    for name in HostSummary.__dataclass_fields__:
        got, want = getattr(row.summary, name), getattr(expected, name)
        if isinstance(want, Unavailable):
            assert isinstance(got, Unavailable), name
        else:
            assert got == pytest.approx(want), name
    events = FleetEvents(fleet.address).events(view)
    frozen = [e for e in events if e.host == fleet.address(FROZEN)]
    assert isinstance(frozen[0], SummaryReceived) and frozen[0].summary == row.summary
    assert isinstance(frozen[1], HostUnreachable) and frozen[1].error.startswith("stale: its newest snapshot")


def test_a_suspect_host_has_its_verdict_from_its_hang_series(fleet: Fleet) -> None:
    """The golden snapshot's host is suspect since a known time; its ranks are ok and exited,
    so no rank is named (the banner names only ranks at the host's level or worse)."""
    view, _ = fetch(fleet)
    hang = fleet.frozen.hang
    assert hang.level == pb.HANG_LEVEL_SUSPECT and {v.level for v in hang.ranks} == {pb.HANG_LEVEL_OK, pb.HANG_LEVEL_EXITED}
    assert view.hangs == {FROZEN: HangStatus("suspect", hang.since_unix_ns, "", ())}
    assert view.rows[FROZEN].summary.hang_level == "suspect"


def test_hosts_without_series_are_unreachable_with_the_reason(fleet: Fleet) -> None:
    view, queries = fetch(fleet)
    # the server's time, and one to learn why hosts are missing, one for the suspect (frozen) host's hang verdict,
    # one for the slow jobs
    assert queries == len(column_queries(fleet.selection)) + 4
    assert view.missing[UNSCRAPED] == NOT_SCRAPED
    assert view.missing[UNSCRAPABLE].startswith(f"Prometheus cannot scrape it (up == 0 for {UNSCRAPABLE}:")
    assert set(view.missing) == {UNSCRAPED, UNSCRAPABLE}


def test_match_selects_hosts_by_pattern(fleet: Fleet) -> None:
    view, _ = fetch(fleet, HostSelection.matching(r"127\.0\.0\.[23]"))
    assert set(view.rows) == {NODE_A, NODE_B} and not view.missing


def test_status_json_keeps_one_entry_per_host(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--prometheus", fleet.url, "--port", str(fleet.agent_port), "--json",
                 *fleet.selection.expected])
    assert code == 1  # not every host is reachable
    document = json.loads(capsys.readouterr().out)
    hosts = {entry["host"]: entry for entry in document["hosts"]}
    assert list(hosts) == [fleet.address(node) for node in fleet.selection.expected]
    for node in (NODE_A, NODE_B):
        assert hosts[fleet.address(node)]["reachable"] is True
        assert hosts[fleet.address(node)]["error"] is None
        assert 0 <= hosts[fleet.address(node)]["summary"]["cpu_percent"] <= 100
    assert hosts[fleet.address(FROZEN)]["reachable"] is False
    assert hosts[fleet.address(FROZEN)]["error"].startswith("stale:")
    assert hosts[fleet.address(FROZEN)]["summary"]["step_time_seconds"] == 0.8125  # last figures kept
    assert hosts[fleet.address(UNSCRAPED)] | {"error": None} == hosts[fleet.address(UNSCRAPED)] | {
        "error": None, "reachable": False, "summary": None}
    assert hosts[fleet.address(UNSCRAPED)]["error"] == NOT_SCRAPED
    # hang: the level of every host with series; since when and the ranks only of the troubled ones
    assert hosts[fleet.address(NODE_A)]["hang"] == {
        "level": "ok", "since_unix_ns": None, "explanation": None, "ranks": None,
        "unavailable": {"since_unix_ns": ONLY_TROUBLED, "explanation": NO_FREE_TEXT, "ranks": ONLY_TROUBLED}}
    assert hosts[fleet.address(FROZEN)]["hang"] == {
        "level": "suspect", "since_unix_ns": fleet.frozen.hang.since_unix_ns, "explanation": None,
        "ranks": [], "unavailable": {"explanation": NO_FREE_TEXT}}  # its ranks are ok or exited
    assert hosts[fleet.address(UNSCRAPED)]["hang"] is None


def test_status_table_over_prometheus(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--prometheus", fleet.url, "--match", r"127\.0\.0\.[23]"]) == 0
    out = capsys.readouterr().out
    assert NODE_A in out and NODE_B in out and "DOWN" not in out


def test_status_table_shows_a_stale_host_down_with_its_last_figures(
        fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--prometheus", fleet.url, "--match", "gpu-node-07"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if FROZEN in line and "│" in line)
    assert "DOWN" in row and "812 ms" in row and "713 W" in row and "suspect" in row, row  # its last figures
    assert f"{FROZEN}: unreachable: stale: its newest snapshot in Prometheus is" in out


async def test_console_shows_prometheus_rows_and_opens_only_the_host_asked_for(fleet: Fleet) -> None:
    from tuiprof.tui.app import TuiprofApp
    from tuiprof.tui.screens.cluster import ClusterScreen
    from tuiprof.tui.screens.host import HostScreen

    source = PrometheusSource(fleet.url, fleet.selection, ConnectionOptions(timeout=10), fleet.agent_port,
                              refresh_s=1.0)
    app = TuiprofApp(source)
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = time.monotonic() + ROWS_TIMEOUT_S
        while not all(app.cluster.host(fleet.address(n)).reachable is not None for n in fleet.selection.expected):
            assert time.monotonic() < deadline, list(app.cluster.hosts())
            await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        screen.refresh_data()
        await pilot.pause()
        assert str(screen.grid.cell(fleet.address(NODE_A), "state")) == "up"
        assert str(screen.grid.cell(fleet.address(FROZEN), "state")).startswith("DOWN")
        assert str(screen.grid.cell(fleet.address(UNSCRAPED), "state")).startswith("DOWN")
        assert app.cluster.host(fleet.address(UNSCRAPABLE)).error.startswith("Prometheus cannot scrape it")
        assert app.cluster.host(fleet.address(NODE_A)).message is None  # no agent contacted yet

        screen.grid.move_cursor(screen.grid.keys.index(fleet.address(NODE_A)))
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        while app.cluster.host(fleet.address(NODE_A)).message is None:  # its agent, over gRPC
            assert time.monotonic() < deadline + 30, app.cluster.host(fleet.address(NODE_A))
            await pilot.pause(0.2)
        opened = app.cluster.host(fleet.address(NODE_A)).message
        assert opened is not None and opened.hostname == NODE_A
        assert app.cluster.host(fleet.address(NODE_B)).message is None  # only the host asked for
        assert list(source.attended()) == [fleet.address(NODE_A)]

        await pilot.press("escape")
        released = time.monotonic() + 10
        while source.attended():  # closed at the next refresh after its screen closed
            assert time.monotonic() < released
            await pilot.pause(0.2)


def test_recorded_series_give_the_rows_the_raw_queries_give(fleet: Fleet) -> None:
    """With docs/prometheus/tuiprof-rules.yml loaded the console reads one series per host and
    column; the figures are those of the same scrape aggregated at query time."""
    async def loaded() -> bool:
        async with PrometheusClient(fleet.url) as client:
            return await recording_rules_loaded(client)
    assert asyncio.run(loaded())
    recorded, raw = fetch(fleet, recorded=True)[0].rows, fetch(fleet)[0].rows
    assert set(recorded) == set(raw) == {NODE_A, NODE_B, FROZEN}
    assert recorded[FROZEN].summary == raw[FROZEN].summary  # its figures never change: every column, reasons too
    for node in (NODE_A, NODE_B):
        assert recorded[node].summary.gpu_count == raw[node].summary.gpu_count  # unavailable, same reason


class TimedClient(PrometheusClient):
    """A real client that notes when each query was sent and when its answer was read."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.spans: list[tuple[str, float, float]] = []

    async def query(self, promql: str, at: float | None = None) -> QueryResult:
        sent = time.monotonic()
        try:
            return await super().query(promql, at)
        finally:
            self.spans.append((promql, sent, time.monotonic()))


def test_whether_the_rules_are_loaded_costs_no_round_trip_of_its_own(fleet: Fleet) -> None:
    """Found out at every refresh: from the recorded columns themselves when the rules were
    loaded at the last one; else by the rules probe sent beside the raw columns, not before
    them (then, the rules being loaded, the recorded columns are read)."""
    selection = HostSelection(expected=(NODE_A, NODE_B))

    async def one(guess: bool) -> tuple[FleetView, list[tuple[str, float, float]]]:
        async with TimedClient(fleet.url) as client:
            return await fetch_fleet(client, selection, guess=guess), client.spans

    recorded = set(column_queries(selection, recorded=True).values())
    slow = slow_jobs_query(selection)
    view, spans = asyncio.run(one(guess=True))
    assert view.recorded and set(view.rows) == {NODE_A, NODE_B}
    # no probe; the slow jobs after the columns
    assert {promql for promql, _, _ in spans} == recorded | {SERVER_TIME, slow} and len(spans) == len(recorded) + 2

    view, spans = asyncio.run(one(guess=False))
    assert view.recorded and set(view.rows) == {NODE_A, NODE_B}
    # time, raw columns and the probe, then time, the recorded columns; the slow jobs
    assert len(spans) == 2 * len(recorded) + 4 and spans[-1][0] == slow
    [(_, _, probe_answered)] = [span for span in spans if span[0] == RULES_PROBE]
    assert min(sent for promql, sent, _ in spans if promql != RULES_PROBE) < probe_answered  # not serial
    assert {promql for promql, _, _ in spans[-len(recorded) - 1:-1]} == recorded


async def test_a_refresh_keeps_the_rows_whose_snapshot_did_not_change(fleet: Fleet) -> None:
    """The frozen agent's snapshot never changes: its row is the last view's, not built again.
    A console's refresh after its first is one query per column (and the hang query of the
    suspect host), in the mode the first found."""
    source = PrometheusSource(fleet.url, HostSelection.matching(rf"{FROZEN}|127\.0\.0\.2"), ConnectionOptions(),
                              fleet.agent_port)
    events: list[object] = []
    async with TimedClient(fleet.url) as client:
        await source.refresh(client, events.append)
        first = source.last_view
        sent = len(client.spans)
        await source.refresh(client, events.append)
        second = source.last_view
        assert len(client.spans) - sent == len(column_queries(fleet.selection)) + 3  # + the server's time, slow jobs
    assert first is not None and second is not None and second.recorded
    assert second.rows[FROZEN] is first.rows[FROZEN]
    assert second.rows[FROZEN].summary.step_time_seconds == 0.8125  # its figures, from the first refresh
    for node in (FROZEN, NODE_A):
        assert (second.rows[node] is first.rows[node]) == (second.rows[node].sampled_at == first.rows[node].sampled_at)


async def test_a_host_left_after_its_agent_was_watched_gets_its_row_afresh(fleet: Fleet) -> None:
    """While a host is watched over gRPC its rows from Prometheus are not sent; once it is left,
    the next refresh sends its row again, built anew, even though its snapshot is the same."""
    source = PrometheusSource(fleet.url, HostSelection.matching(FROZEN), ConnectionOptions(timeout=5),
                              fleet.agent_port)
    events: list[HostEvent] = []
    source._emit = events.append
    watched = [True]
    async with PrometheusClient(fleet.url) as client:
        await source.refresh(client, events.append)
        first = source.last_view
        source.attend(fleet.address(FROZEN), lambda: watched[0])
        await source.refresh(client, events.append)
        watched[0] = False
        events.clear()
        await source.refresh(client, events.append)
    assert first is not None and source.last_view is not None
    row = source.last_view.rows[FROZEN]
    assert row.sampled_at == first.rows[FROZEN].sampled_at and row is not first.rows[FROZEN]
    assert [e.summary for e in events if isinstance(e, SummaryReceived)] == [row.summary]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: apt-get install tmux")
def test_tuiprof_prometheus_in_a_terminal(fleet: Fleet, tmp_path: pathlib.Path) -> None:
    """The command line, end to end: `tuiprof --prometheus URL --match RE` in a real terminal."""
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    console = [sys.executable, "-m", "tuiprof.cli", "--prometheus", fleet.url, "--match", r"127\.0\.0\.[23]",
               "--port", str(fleet.agent_port)]
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "40", "-e", f"XDG_CONFIG_HOME={tmp_path}",
                    shlex.join(console)], check=True, timeout=10, env=tmux_environment())
    try:
        deadline, screen = time.monotonic() + 30, ""
        while not all(text in screen for text in ("2/2 hosts up", f"{NODE_A}:{fleet.agent_port}",
                                                  f"{NODE_B}:{fleet.agent_port}")):
            assert time.monotonic() < deadline, screen
            time.sleep(0.3)
            screen = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True,
                                    check=True, timeout=10).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, timeout=10)


def test_the_slow_jobs_come_from_the_agents_verdict_series(fleet: Fleet) -> None:
    """The frozen agent's snapshot judges job 4242 slow (gpu_slower, rank 8 costing 62.5 ms a step): the
    fleet view names it with its cause and cost, and the banner says so; the healthy job is not named."""
    view, _ = fetch(fleet)
    assert view.slow_jobs == [SlowJob("4242", "gpu_slower", pytest.approx(0.0625))]
    banner = fleet_slow_banner(view.slow_jobs)
    assert banner is not None and banner.text.startswith(
        "SLOW jobs (Prometheus, each judged on its hosts): 4242: gpu slower, its costliest rank 62.5 ms a step")
