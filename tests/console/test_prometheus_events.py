"""Successive Prometheus views become host events once per change (no Prometheus needed here:
the views are what fetch_fleet returns; test_prometheus_fleet.py gets them from a real one)."""

from __future__ import annotations

import asyncio

from tuiprof.client.prometheus import (
    FIGURES, NOT_RECORDED_YET, NOT_SCRAPED, FleetEvents, FleetView, HostRow, HostSelection, QueryResult, column_queries,
)
from tuiprof.client.prometheus.fleet import NOT_EVERY_GPU, NOT_EXPORTED, _Columns, _rows
from tuiprof.client.prometheus.http import Labels, Sample
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import HostUnreachable, SummaryReceived
from tuiprof.model.messages import HangStatus
from tuiprof.model.summary import HostSummary
from tuiprof.model.values import Unavailable

SUMMARY = HostSummary(
    cpu_percent=25.0, memory_percent=50.0, memory_used_bytes=8e9, gpu_count=Unavailable("NVML: no driver"),
    gpu_util_mean=Unavailable("NVML: no driver"), gpu_util_min=Unavailable("NVML: no driver"),
    sm_active_mean=Unavailable("NVML: no driver"), sm_active_min=Unavailable("NVML: no driver"),
    power_watts=Unavailable("NVML: no driver"), gpu_memory_used_bytes=Unavailable("NVML: no driver"),
    gpu_memory_total_bytes=Unavailable("NVML: no driver"), nccl_busbw_bytes_per_s=Unavailable("no ranks"),
    step_time_seconds=Unavailable("no ranks"), hang_level="ok",
)


def view(at: float, sampled: dict[str, float], missing: dict[str, str] | None = None) -> FleetView:
    rows = {node: HostRow(node, node, t, SUMMARY) for node, t in sampled.items()}
    return FleetView(at, rows, missing or {}, query_seconds=0.01, recorded=False)


def kinds(events: list) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.host) for e in events]


def test_a_row_from_prometheus_keeps_what_the_agent_said_before() -> None:
    """``ClusterState.apply`` builds the new state field by field for rows and snapshots (the
    10,000-host refresh): a Prometheus row replaces the figures and keeps the agent's info and
    last snapshot (a host drilled into, then left), for every field the state has."""
    import dataclasses

    from agentd.proto import tuiprof_agent_pb2 as pb
    from tuiprof.model.cluster import HostState
    from tuiprof.model.events import InfoReceived, SnapshotReceived

    assert [f.name for f in dataclasses.fields(HostState)] == [
        "address", "reachable", "error", "last_contact", "info", "message", "summary"]
    cluster = ClusterState(["n1:1779"])
    cluster.apply(InfoReceived("n1:1779", 10.0, pb.AgentInfo(hostname="n1", agent_version="9.9")))
    message = pb.HostSnapshot(hostname="n1", timestamp_unix_ns=11 * 10**9)
    cluster.apply(SnapshotReceived("n1:1779", 11.0, message))
    cluster.apply(HostUnreachable("n1:1779", 12.0, "gone"))
    state = cluster.apply(SummaryReceived("n1:1779", 13.0, SUMMARY))
    assert (state.reachable, state.error, state.last_contact, state.summary) == (True, "", 13.0, SUMMARY)
    assert state.info is not None and state.info.agent_version == "9.9" and state.message is message
    assert state.snapshot is not None and state.snapshot.hostname == "n1"
    assert cluster.history("n1:1779").points("cpu")[-1] == (13.0, SUMMARY.cpu_percent)


def test_a_row_is_sent_once_per_new_snapshot() -> None:
    events = FleetEvents(lambda node: f"{node}:1779")
    assert kinds(events.events(view(100, {"n1": 99, "n2": 98}))) == [
        ("SummaryReceived", "n1:1779"), ("SummaryReceived", "n2:1779")]
    assert events.events(view(105, {"n1": 99, "n2": 98})) == []  # nothing new scraped
    assert kinds(events.events(view(110, {"n1": 109, "n2": 98}))) == [("SummaryReceived", "n1:1779")]


def test_stale_then_fresh_again() -> None:
    events = FleetEvents(str, stale_after_s=60)
    cluster = ClusterState([])
    for event in events.events(view(100, {"n1": 99})):
        cluster.apply(event)
    stale = events.events(view(170, {"n1": 99}))
    assert len(stale) == 1 and isinstance(stale[0], HostUnreachable)
    assert stale[0].error == ("stale: its newest snapshot in Prometheus is 71 s old (the agent stopped "
                              "sampling, or Prometheus stopped scraping it)")
    cluster.apply(stale[0])
    assert not cluster.host("n1").reachable and cluster.host("n1").summary == SUMMARY  # last figures kept
    assert events.events(view(180, {"n1": 99})) == []  # still stale: said once, not every refresh
    fresh = events.events(view(190, {"n1": 189}))
    assert kinds(fresh) == [("SummaryReceived", "n1")]
    cluster.apply(fresh[0])
    assert cluster.host("n1").reachable and cluster.host("n1").last_contact == 189


def test_a_host_that_vanishes_is_reported_with_the_reason() -> None:
    events = FleetEvents(str)
    events.events(view(100, {"n1": 99, "n2": 99}))
    assert events.seen() == ["n1", "n2"]  # fetch_fleet asks why a seen host is missing later
    gone = events.events(view(110, {"n1": 109}, {"n2": NOT_SCRAPED}))
    assert kinds(gone) == [("SummaryReceived", "n1"), ("HostUnreachable", "n2")]
    assert events.events(view(120, {"n1": 109}, {"n2": NOT_SCRAPED})) == []
    back = events.events(view(130, {"n1": 109, "n2": 129}))
    assert kinds(back) == [("SummaryReceived", "n2")]


def test_prometheus_failing_makes_every_known_host_unknown_once() -> None:
    events = FleetEvents(str)
    events.events(view(100, {"n1": 99, "n2": 99}))
    failed = events.all_unreachable(105, "cannot reach Prometheus at http://p:9090: refused", skip=["n2"])
    assert kinds(failed) == [("HostUnreachable", "n1")]  # n2 is watched over gRPC meanwhile
    assert events.all_unreachable(110, "cannot reach Prometheus at http://p:9090: refused") == [
        HostUnreachable("n2", 110, "cannot reach Prometheus at http://p:9090: refused")]
    assert kinds(events.events(view(115, {"n1": 114, "n2": 114}))) == [
        ("SummaryReceived", "n1"), ("SummaryReceived", "n2")]


def test_expected_nodes_match_short_and_dotted_hostnames() -> None:
    selection = HostSelection(expected=("n1", "10.0.0.7"))
    assert selection.node_of("n1.cluster.example") == "n1"
    assert selection.node_of("n1") == "n1"
    assert selection.node_of("10.0.0.7") == "10.0.0.7"
    assert selection.node_of("10.0.0.8") == "10.0.0.8"  # an address is never shortened to "10"
    assert selection.matcher() == 'hostname=~"(?:n1|10\\\\.0\\\\.0\\\\.7)(?:[.].*)?"'


def test_a_host_not_recorded_yet_says_so_rather_than_no_gpus() -> None:
    """The columns are queried at once: answers that straddle the rules' first evaluation of a
    host can give its recorded time (the group's last rule) but not yet its figures."""
    def answer(name: str) -> QueryResult:
        samples = [Sample(Labels(hostname="n1"), (100.0, "99"))] if name == "sampled_at" else []
        return QueryResult(100.0, samples)

    columns = _Columns({name: answer(name) for name in column_queries(HostSelection(), recorded=True)},
                       recorded=True)
    [summary] = columns.summaries(["n1"])
    assert summary.gpu_count == summary.cpu_percent == summary.step_time_seconds == Unavailable(NOT_RECORDED_YET)
    assert summary.memory_used_bytes == Unavailable(NOT_RECORDED_YET)


def test_a_row_is_kept_while_its_snapshot_is_the_same() -> None:
    """A host whose snapshot time did not change keeps its last row (its figures are not read
    again); a new snapshot, or another hostname behind the same node, gets a new row."""
    def columns(cpu: dict[str, str], sampled: dict[str, str]) -> _Columns:
        answers = {"cpu_percent": cpu, "sampled_at": sampled,
                   "rank_count": dict.fromkeys(sampled, "8")}
        return _Columns({name: QueryResult(100.0, [Sample(Labels(hostname=host), (100.0, value))
                                                   for host, value in answers.get(name, {}).items()])
                         for name in column_queries(HostSelection())}, recorded=False)

    selection = HostSelection(expected=("n1", "n2", "n3"))
    first = _rows(columns({"n1": "10", "n2": "20", "n3": "30"}, {"n1": "90", "n2": "90", "n3": "90"}), selection, {})
    second = _rows(columns({"n1": "11", "n2": "21", "n3.a": "31"}, {"n1": "90", "n2": "95", "n3.a": "90"}),
                   selection, first)
    assert second["n1"] is first["n1"] and second["n1"].summary.cpu_percent == 10.0  # same snapshot
    assert second["n2"].sampled_at == 95.0 and second["n2"].summary.cpu_percent == 21.0
    assert second["n3"].hostname == "n3.a" and second["n3"].summary.cpu_percent == 31.0
    assert second["n2"].rank_count == 8 and isinstance(second["n2"].summary.gpu_count, Unavailable)


def test_each_summary_field_is_filled_by_its_figure() -> None:
    """Every field of ``HostSummary`` but ``memory_percent`` (worked out) is one figure's, and a
    row holds each figure's own answer in that field."""
    fills = [figure.fills for figure in FIGURES.values() if figure.fills]
    assert sorted([*fills, "memory_percent"]) == sorted(HostSummary.__dataclass_fields__)
    numbers = [figure for figure in FIGURES.values() if figure.fills and figure.name != "hang"]
    answers = {figure.name: QueryResult(100.0, [Sample(Labels(hostname="n1"), (100.0, str(i + 1)))])
               for i, figure in enumerate(numbers)}
    answers["memory_total_bytes"] = QueryResult(100.0, [Sample(Labels(hostname="n1"), (100.0, "8"))])
    answers["hang"] = QueryResult(100.0, [Sample(Labels(hostname="n1", level="suspect"), (100.0, "1"))])
    columns = _Columns({**{name: QueryResult(100.0, []) for name in column_queries(HostSelection())}, **answers},
                       recorded=False)
    [summary] = columns.summaries(["n1"])
    assert [getattr(summary, figure.fills) for figure in numbers] == list(range(1, len(numbers) + 1))
    assert summary.memory_percent == 100.0 * summary.memory_used_bytes / 8 and summary.hang_level == "suspect"


def test_a_figure_a_host_lacks_says_why_by_its_kind() -> None:
    """A figure's ``why_missing`` picks its reason: GPU figures of a host with GPUs are not
    exported, GPU sums not complete, and without GPUs there are none; likewise for ranks."""
    answers = {"sampled_at": {"n1": "90", "n2": "90"}, "cpu_percent": {"n1": "10", "n2": "10"},
               "gpu_count": {"n1": "8"}, "rank_count": {"n1": "8"}}
    columns = _Columns({name: QueryResult(100.0, [Sample(Labels(hostname=host), (100.0, value))
                                                  for host, value in answers.get(name, {}).items()])
                        for name in column_queries(HostSelection())}, recorded=False)
    with_both, without = columns.summaries(["n1", "n2"])
    assert with_both.gpu_util_mean == with_both.step_time_seconds == with_both.memory_used_bytes == Unavailable(
        NOT_EXPORTED)
    assert with_both.power_watts == Unavailable(NOT_EVERY_GPU)
    assert with_both.nccl_busbw_bytes_per_s == Unavailable("no NCCL collectives seen")
    assert without.gpu_util_min == without.gpu_memory_total_bytes == Unavailable("no GPUs on this host")
    assert without.nccl_busbw_bytes_per_s == without.step_time_seconds == Unavailable("no training processes seen")


def test_the_ops_view_watches_at_most_so_many_hosts_with_ranks(monkeypatch) -> None:
    """Past RANK_HOSTS_AT_ONCE hosts with ranks the hung or suspect ones are watched first, then
    the others by name, and the notice says how to see the rest; hosts without ranks never are."""
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.prometheus import events

    monkeypatch.setattr(events, "RANK_HOSTS_AT_ONCE", 2)
    rows = {node: HostRow(node, node, 99.0, SUMMARY, ranks) for node, ranks in
            (("n3", 8), ("n1", 8), ("cpu", 0), ("n2", 4))}

    async def attend(hangs: dict[str, HangStatus]) -> tuple[str, list[str]]:
        source = events.PrometheusSource("http://prometheus.test", HostSelection(), ConnectionOptions(), 1780)
        assert "no answer from Prometheus yet" in source.attend_ranks(lambda: True)
        source.last_view = FleetView(100.0, rows, {}, 0.01, False, hangs)
        source._emit = [].append
        notice = source.attend_ranks(lambda: True)
        attended = source.attended()
        for task, _ in source._attended.values():
            task.cancel()
        return notice, attended

    notice, attended = asyncio.run(attend({}))
    assert attended == ["n1:1780", "n2:1780"]
    assert notice.endswith(": the first 2 of 3 hosts with ranks (hung or suspect first, then by name); "
                           "name the job with --slurm-job or fewer hosts with --match to see the rest")
    notice, attended = asyncio.run(attend({"n3": HangStatus("hung", 1, "", ())}))
    assert attended == ["n3:1780", "n1:1780"]
