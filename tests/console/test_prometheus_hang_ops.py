"""A hung rank and the NCCL/GEMM view in Prometheus mode, from a real Prometheus scraping a real agent.

The rank is the stand-in GPU workload under `tuiprof run` (the real hook library over
stand-in cuBLAS/NCCL), stopped at READY with its last collective never finishing; a
real agentd, named after the loopback address it listens on, judges it hung after a
short timeout. A second target is a host without training processes (agentd's
exposition of a CPU-only snapshot). Prometheus scrapes both; the console reads:

- the hang banner from the agents' hang series, in one query over the troubled hosts,
  with no gRPC connection, then the hung host's own agent over gRPC once drilled into;
- the NCCL/GEMM view (`n`) from the agents of the hosts that have ranks, and only those,
  over gRPC while the view is open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from native.conftest import standins  # noqa: F401  (the stand-in GPU libraries, built with gcc)
from native.support import stand_in_rank

from agentd.address import AgentAddress
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from console.prometheus_server import PROMETHEUS, frozen_agent, named_agent, running_prometheus
from testkit.ports import free_port
from tuiprof.analysis.job_ops import job_ops
from tuiprof.cli import main
from tuiprof.client.channel import ConnectionOptions, open_channel
from tuiprof.client.prometheus import (
    HANG_HOSTS_NAMED, FleetView, HostSelection, PrometheusClient, PrometheusSource, column_queries, fetch_fleet,
    hang_query, hang_statuses,
)
from tuiprof.model.messages import HangStatus

NODE = "127.0.0.8"  # the agent with the hung rank (other modules use .2 to .6)
CPU_NODE = "cpu-node-01"  # no training processes: an exposition served on 127.0.0.9
STUCK_RANK = 3
HANG_ARGS = ("--hang-suspect-s", "1", "--hang-timeout-s", "3")
TIMEOUT_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt package prometheus)"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="naming an agent needs unshare (UTS namespace)"),
]


@dataclasses.dataclass
class HungJob:
    url: str
    agent_port: int
    pid: int
    """The stand-in rank's process."""

    @property
    def selection(self) -> HostSelection:
        return HostSelection(expected=(NODE, CPU_NODE))

    def address(self, node: str) -> str:
        return f"{node}:{self.agent_port}"


def fetch(job: HungJob) -> tuple[FleetView, int]:
    async def one() -> tuple[FleetView, int]:
        async with PrometheusClient(job.url) as client:
            return await fetch_fleet(client, job.selection, recorded=False), client.queries_sent
    return asyncio.run(one())


async def hung_snapshot(address: AgentAddress) -> pb.HostSnapshot:
    """The agent's first snapshot saying hung, from its Watch stream."""
    async with open_channel(address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=TIMEOUT_S)
        async for snapshot in call:
            if snapshot.hang.level == pb.HANG_LEVEL_HUNG:
                call.cancel()
                return snapshot
    raise AssertionError(f"{address} never said hung")


def our_verdict(status: HangStatus | None, pid: int) -> str:
    """The stand-in rank's level in ``status`` ("" when not named)."""
    return next((v.level for v in status.ranks if v.pid == pid), "") if status else ""


@pytest.fixture(scope="module")
def hung_job(standins: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungJob]:  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("naming an agent needs root (UTS namespace)")
    directory = tmp_path_factory.mktemp("hung-job")
    port, metrics_port = free_port("0.0.0.0"), free_port("0.0.0.0")
    targets = directory / "targets.json"
    assert main(["prometheus-targets", NODE, f"127.0.0.9:{metrics_port}", "--metrics-port", str(metrics_port),
                 "--output", str(targets)]) == 0
    cpu_only = pb.HostSnapshot(hostname=CPU_NODE, timestamp_unix_ns=time.time_ns())
    cpu_only.cpu.idle_percent = 50.0
    env = {"RANK": str(STUCK_RANK), "WORLD_SIZE": "4", "TUIPROF_JOB_ID": f"prom-{uuid.uuid4().hex[:8]}"}
    with (stand_in_rank(standins, env) as rank,
          named_agent(directory, NODE, port, metrics_port, extra_args=HANG_ARGS),
          frozen_agent("127.0.0.9", metrics_port, cpu_only),
          running_prometheus(directory, file_sd=targets, scrape_interval="1s") as url):
        job = HungJob(url, port, rank.pid)
        deadline = time.monotonic() + TIMEOUT_S
        view = fetch(job)[0]
        while set(view.rows) != {NODE, CPU_NODE} or our_verdict(view.hangs.get(NODE), rank.pid) != "hung":
            assert time.monotonic() < deadline, f"no hung rank in Prometheus: {view}"
            time.sleep(0.5)
            view = fetch(job)[0]
        yield job


def test_the_hung_rank_comes_from_its_hang_series_in_one_more_query(hung_job: HungJob) -> None:
    view, queries = fetch(hung_job)
    # the time, the columns, one for the hung host, one for the slow jobs
    assert queries == len(column_queries(hung_job.selection)) + 3
    status = view.hangs[NODE]
    assert status.level == "hung" and view.rows[NODE].summary.hang_level == "hung"
    ours = next(v for v in status.ranks if v.pid == hung_job.pid)
    assert ours.rank == STUCK_RANK and ours.level == "hung"
    assert CPU_NODE not in view.hangs and view.rows[CPU_NODE].rank_count == 0
    # the same verdict as the agent's own, over gRPC (since when to the exposition's precision)
    snapshot = asyncio.run(hung_snapshot(AgentAddress(NODE, hung_job.agent_port)))
    assert abs(status.since_unix_ns - snapshot.hang.since_unix_ns) < 10**6
    assert {(v.pid, v.rank) for v in snapshot.hang.ranks if v.level == pb.HANG_LEVEL_HUNG} >= {(hung_job.pid, STUCK_RANK)}


def test_a_whole_job_in_trouble_is_read_through_the_views_own_matcher(hung_job: HungJob) -> None:
    """Past HANG_HOSTS_NAMED troubled hosts the query selects them as the view does rather than by
    name: the same verdicts come back."""
    many = [NODE, *(f"node-{i}" for i in range(HANG_HOSTS_NAMED))]
    assert hung_job.selection.matcher() in hang_query(hung_job.selection, many)
    assert "node-0" not in hang_query(hung_job.selection, many)

    async def verdicts(hostnames: list[str]) -> dict[str, HangStatus]:
        async with PrometheusClient(hung_job.url) as client:
            answer = await client.query(hang_query(hung_job.selection, hostnames))
        return hang_statuses({NODE: "hung"}, answer)
    named, matched = asyncio.run(verdicts([NODE])), asyncio.run(verdicts(many))
    assert named == matched and our_verdict(named[NODE], hung_job.pid) == "hung"


def console_source(job: HungJob) -> PrometheusSource:
    """The source `tuiprof --prometheus URL --match ...` gives the console, refreshing every second."""
    return PrometheusSource(job.url, job.selection, ConnectionOptions(timeout=10), job.agent_port, refresh_s=1.0)


async def until_both_hosts_are_rows(source: PrometheusSource, pilot: Any) -> float:
    """Wait until Prometheus lists the host with ranks and the one without; the deadline used."""
    deadline = time.monotonic() + TIMEOUT_S
    while source.last_view is None or set(source.last_view.rows) != {NODE, CPU_NODE}:
        assert time.monotonic() < deadline
        await pilot.pause(0.2)
    return deadline


async def test_banner_from_prometheus_then_the_hung_host_over_grpc(hung_job: HungJob) -> None:
    from tuiprof.tui.app import TuiprofApp
    from tuiprof.tui.screens.cluster import ClusterScreen
    from tuiprof.tui.screens.host import HostScreen

    source = console_source(hung_job)
    app = TuiprofApp(source)
    hung = hung_job.address(NODE)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        banner = screen.query_one("#hang-banner")
        deadline = time.monotonic() + TIMEOUT_S
        while not banner.display:
            assert time.monotonic() < deadline, list(app.cluster.hosts())
            await pilot.pause(0.2)
        text = str(banner.render())
        assert text.startswith("HUNG on 1 host for ") and text.endswith("press s for merged stacks"), text
        folded = re.search(r"— ranks? ([0-9,\-]+) —", text)
        assert folded and str(STUCK_RANK) in re.split(r"[,\-]", folded.group(1)), text
        assert app.cluster.host(hung).message is None  # from Prometheus alone: no agent contacted

        screen.grid.move_cursor(screen.grid.keys.index(hung))
        await pilot.press("enter")
        assert isinstance(app.screen, HostScreen)
        while (message := app.cluster.host(hung).message) is None or message.hang.level != pb.HANG_LEVEL_HUNG:
            assert time.monotonic() < deadline + 30, app.cluster.host(hung)
            await pilot.pause(0.2)
        assert any(v.pid == hung_job.pid and v.level == pb.HANG_LEVEL_HUNG for v in message.hang.ranks)
        assert source.attended() == [hung]


async def test_ops_view_opens_only_the_hosts_with_ranks(hung_job: HungJob) -> None:
    from textual.widgets import DataTable

    from tuiprof.tui.app import TuiprofApp
    from tuiprof.tui.screens.job_ops import JobOpsScreen

    source = console_source(hung_job)
    app = TuiprofApp(source)
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = await until_both_hosts_are_rows(source, pilot)
        assert all(h.message is None for h in app.cluster.hosts())  # the cluster view needs no agent

        await pilot.press("n")
        assert isinstance(app.screen, JobOpsScreen)
        assert source.attended() == [hung_job.address(NODE)]  # not the host without ranks
        ours: list = []
        while not {"gemm", "nccl"} <= {r.kind for r in ours}:
            assert time.monotonic() < deadline + 30, list(app.cluster.hosts())
            await pilot.pause(0.2)
            ours = [r for r in job_ops(app.cluster) if r.pid == hung_job.pid]
        assert {r.rank for r in ours} == {f"rank {STUCK_RANK}"}
        await pilot.pause(0.6)  # the view redraws at most twice a second
        assert app.screen.query_one("#ops", DataTable).row_count >= len(ours)
        assert app.cluster.host(hung_job.address(CPU_NODE)).message is None

        await pilot.press("escape")
        released = time.monotonic() + 10
        while source.attended():  # closed at the next refresh after the view closed
            assert time.monotonic() < released
            await pilot.pause(0.2)


async def test_stacks_ask_only_the_hosts_with_ranks(hung_job: HungJob) -> None:
    """`s` in Prometheus mode asks the agents of the hosts with ranks there (the NCCL/GEMM view's
    set), not every host of the view, and says how many it asked."""
    from textual.widgets import Static

    from tuiprof.tui.app import TuiprofApp
    from tuiprof.tui.screens.stacks import StacksScreen

    source = console_source(hung_job)
    app = TuiprofApp(source)
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = await until_both_hosts_are_rows(source, pilot)
        assert len(app.cluster.addresses()) == 2

        await pilot.press("s")
        screen = app.screen
        assert isinstance(screen, StacksScreen)
        status = screen.query_one("#stacks-status", Static)
        while not screen.hosts:
            assert time.monotonic() < deadline + 60, str(status.render())
            await pilot.pause(0.2)
        assert [h.host for h in screen.hosts] == [hung_job.address(NODE)]  # not the host without ranks
        assert "from the 1 host(s) with ranks in Prometheus" in str(status.render())
        assert any(r.pid == hung_job.pid for r in screen.hosts[0].live_ranks())


def test_status_json_has_the_hang_section_the_agent_gives(
        hung_job: HungJob, capsys: pytest.CaptureFixture[str]) -> None:
    """`status --prometheus --json` fills each host's ``hang`` from its hang series with the keys
    of the agent's own (`status HOST --json`); the explanations, which labels cannot carry, are
    null with the reason, and a host that exports no hang series says so."""
    from tuiprof.commands.status import NO_FREE_TEXT, NO_HANG_SERIES

    main(["status", "--prometheus", hung_job.url, "--port", str(hung_job.agent_port), "--json", NODE, CPU_NODE])
    hosts = {entry["host"]: entry for entry in json.loads(capsys.readouterr().out)["hosts"]}
    main(["status", hung_job.address(NODE), "--json"])
    [direct] = json.loads(capsys.readouterr().out)["hosts"]

    hang = hosts[hung_job.address(NODE)]["hang"]
    assert set(hang) - {"unavailable"} == set(direct["hang"]) - {"unavailable"}
    assert hang["level"] == direct["hang"]["level"] == "hung"
    assert abs(hang["since_unix_ns"] - direct["hang"]["since_unix_ns"]) < 10**6
    assert hang["explanation"] is None and hang["unavailable"] == {"explanation": NO_FREE_TEXT}
    assert direct["hang"]["explanation"]  # the agent's own text: only it has one
    ours = next(v for v in hang["ranks"] if v["pid"] == hung_job.pid)
    theirs = next(v for v in direct["hang"]["ranks"] if v["pid"] == hung_job.pid)
    assert set(ours) - {"unavailable"} == set(theirs) - {"unavailable"}
    assert (ours["rank"], ours["level"]) == (theirs["rank"], theirs["level"]) == (STUCK_RANK, "hung")
    assert ours["explanation"] is None and ours["unavailable"] == {"explanation": NO_FREE_TEXT}

    cpu = hosts[hung_job.address(CPU_NODE)]["hang"]
    assert cpu["level"] is None and cpu["unavailable"]["level"] == NO_HANG_SERIES
