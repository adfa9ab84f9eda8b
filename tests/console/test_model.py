"""The console's model: proto → snapshots, JSON, summaries, history, cluster state, filters."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.client.backoff import Backoff
from tuiprof.model import record, units
from tuiprof.model.cluster import CONNECTING, ClusterState, worst_first
from tuiprof.model.events import HostUnreachable, SnapshotReceived
from tuiprof.model.export import cluster_document
from tuiprof.model.filter import FilterError, HostFilter
from tuiprof.model.history import Ring
from tuiprof.model.behaviour import has_rates
from tuiprof.model.messages import HostSnapshot
from tuiprof.model.values import Unavailable


def snapshot_pb(hostname: str = "n1", utils: tuple[float, ...] = (50.0, 70.0), idle: float | None = 60.0,
                gpu_collector: bool = True, hang: pb.HangLevel = pb.HANG_LEVEL_OK) -> pb.HostSnapshot:
    msg = pb.HostSnapshot(hostname=hostname, sequence=3, timestamp_unix_ns=10**18)
    msg.collectors.add(name="host", available=True, interval_seconds=1.0)
    msg.collectors.add(name="gpu", available=gpu_collector,
                       reason="" if gpu_collector else "NVML: NVML Shared Library Not Found")
    msg.collectors.add(name="pmu", available=False, reason="perf_event_paranoid is 4")
    if idle is None:
        msg.cpu.unavailable["idle_percent"] = "first sample: rates need two"
    else:
        msg.cpu.idle_percent = idle
    msg.memory.total_bytes, msg.memory.used_bytes = 1000, 250
    if gpu_collector:
        for index, util in enumerate(utils):
            gpu = msg.gpus.add(index=index, name="H100")
            gpu.utilization_percent = util
            gpu.power_watts = 100.0 * (index + 1)
            gpu.unavailable["sm_active_percent"] = "GPM needs Hopper or newer"
    msg.hang.level = hang
    return msg


def test_optional_fields_become_readings_or_reasons() -> None:
    message = snapshot_pb(idle=None)
    snap = HostSnapshot.from_proto(message)
    assert snap.cpu.idle_percent == Unavailable("first sample: rates need two")
    assert snap.cpu.busy_percent == Unavailable("first sample: rates need two")
    assert not has_rates(message) and has_rates(snapshot_pb())
    assert snap.memory.used_percent == 25.0
    assert snap.gpus[0].sm_active_percent == Unavailable("GPM needs Hopper or newer")
    # a section whose collector could not run carries the collector's reason
    assert snap.pmu.mips == Unavailable("perf_event_paranoid is 4")
    assert snap.cpu.load1 == Unavailable("not reported by the agent")


def test_nested_sections_are_converted_once_when_first_read_and_equal_a_built_model() -> None:
    snap = HostSnapshot.from_proto(snapshot_pb())
    assert snap.gpus is snap.gpus  # converted once, then kept
    assert not hasattr(snap, "no_such_field")
    built = HostSnapshot(**{f.name: getattr(snap, f.name) for f in dataclasses.fields(HostSnapshot)})
    assert built == snap and not hasattr(built, "no_such_field")
    assert HostSnapshot.from_proto(snapshot_pb()).to_json() == snap.to_json()


def test_json_puts_reasons_beside_nulls() -> None:
    data = json.loads(json.dumps(HostSnapshot.from_proto(snapshot_pb(idle=None)).to_json()))
    assert data["cpu"]["idle_percent"] is None
    assert data["cpu"]["unavailable"]["idle_percent"] == "first sample: rates need two"
    assert data["memory"]["used_bytes"] == 250 and "unavailable" not in data["collectors"][0]


def test_summary_aggregates_and_never_invents_zero() -> None:
    summary = (snapshot_pb())
    cluster = ClusterState(["a"])
    cluster.apply(SnapshotReceived("a", 5.0, summary))
    s = cluster.host("a").summary
    assert s.cpu_percent == 40.0
    assert s.gpu_count == 2 and s.gpu_util_mean == 60.0 and s.gpu_util_min == 50.0
    assert s.power_watts == 300.0
    assert s.sm_active_mean == Unavailable("GPM needs Hopper or newer")
    no_gpu = ClusterState(["b"])
    no_gpu.apply(SnapshotReceived("b", 5.0, (snapshot_pb(gpu_collector=False))))
    b = no_gpu.host("b").summary
    assert b.gpu_count == Unavailable("NVML: NVML Shared Library Not Found")
    assert b.power_watts == Unavailable("NVML: NVML Shared Library Not Found")
    assert b.step_time_seconds == Unavailable("the agent has no ranks collector")


def test_cluster_tracks_reachability_and_last_contact() -> None:
    cluster = ClusterState(["a"])
    assert cluster.host("a").reachable is None and cluster.host("a").error == CONNECTING
    cluster.apply(SnapshotReceived("a", 100.0, (snapshot_pb())))
    cluster.apply(HostUnreachable("a", 104.0, "cannot connect: refused"))
    state = cluster.host("a")
    assert state.reachable is False and state.error == "cannot connect: refused"
    assert state.snapshot is not None and state.snapshot.hostname == "n1"  # kept for the host view
    cluster.tick(112.0)
    assert cluster.since_contact(state) == 12.0
    assert cluster.history("a").numbers("cpu") == [40.0]
    with pytest.raises(KeyError, match="unknown host 'zz'"):
        cluster.host("zz")


def test_hosts_sharing_a_name_are_told_apart_as_names_change() -> None:
    """Two agents on one machine answer with one hostname; the names are the addresses until
    a snapshot says otherwise, and follow each later snapshot."""
    cluster = ClusterState(["a:1", "a:2", "b"])
    assert cluster.shared_names() == set()
    cluster.apply(SnapshotReceived("a:1", 1.0, snapshot_pb("gpu1")))
    cluster.apply(SnapshotReceived("a:2", 1.0, snapshot_pb("gpu1")))
    assert cluster.shared_names() == {"gpu1"}
    assert cluster.label(cluster.host("a:2")) == "gpu1@a:2"
    cluster.apply(SnapshotReceived("b", 1.0, snapshot_pb("b")))  # its name is its address: one host
    cluster.apply(HostUnreachable("a:2", 2.0, "refused"))  # down, its name stays
    assert cluster.shared_names() == {"gpu1"}
    cluster.apply(SnapshotReceived("a:2", 3.0, snapshot_pb("gpu2")))
    assert cluster.shared_names() == set() and cluster.label(cluster.host("a:2")) == "gpu2"


def test_export_document_has_both_kinds_of_host() -> None:
    cluster = ClusterState(["up", "down"])
    cluster.apply(SnapshotReceived("up", 1.0, (snapshot_pb())))
    cluster.apply(HostUnreachable("down", 1.0, "refused: wrong or missing token"))
    doc = json.loads(json.dumps(cluster_document(cluster)))
    up, down = doc["hosts"]
    assert up["reachable"] is True and up["error"] is None and up["gpus"][1]["utilization_percent"] == 70.0
    assert up["pmu"]["unavailable"]["mips"] == "perf_event_paranoid is 4"
    assert down == {**down, "reachable": False, "error": "refused: wrong or missing token", "cpu": None}


def test_worst_host_first() -> None:
    cluster = ClusterState(["busy", "idle", "hung", "down"])
    cluster.apply(SnapshotReceived("busy", 1.0, (snapshot_pb(utils=(90.0, 95.0)))))
    cluster.apply(SnapshotReceived("idle", 1.0, (snapshot_pb(utils=(90.0, 3.0)))))
    cluster.apply(SnapshotReceived("hung", 1.0, (snapshot_pb(hang=pb.HANG_LEVEL_HUNG))))
    cluster.apply(HostUnreachable("down", 1.0, "refused"))
    assert [h.address for h in sorted(cluster.hosts(), key=worst_first)] == ["down", "hung", "idle", "busy"]


@pytest.mark.parametrize("text, expected", [
    ("util<60", ["low"]), ("util>=60", ["high"]), ("n2", ["high"]), ("minutil<60 n1", ["low"]),
    ("power>250", ["low", "high"]), ("hang=ok", ["low", "high"]), ("hang!=ok", []), ("", ["low", "high"]),
])
def test_filter_expressions(text: str, expected: list[str]) -> None:
    cluster = ClusterState([])
    cluster.apply(SnapshotReceived("low", 1.0, (snapshot_pb("n1", (50.0, 60.0)))))
    cluster.apply(SnapshotReceived("high", 1.0, (snapshot_pb("n2", (80.0, 90.0)))))
    host_filter = HostFilter.parse(text)
    assert [h.address for h in cluster.hosts() if host_filter.matches(h)] == expected


def test_filter_unavailable_never_matches_and_errors_are_clear() -> None:
    cluster = ClusterState([])
    cluster.apply(SnapshotReceived("cpu-only", 1.0, (snapshot_pb(gpu_collector=False))))
    assert not HostFilter.parse("util<10").matches(cluster.host("cpu-only"))
    with pytest.raises(FilterError, match="unknown field 'utl'; known fields: cpu"):
        HostFilter.parse("utl<10")
    with pytest.raises(FilterError, match="'x' is not a number"):
        HostFilter.parse("util<x")
    with pytest.raises(FilterError, match="hang compares with = or !="):
        HostFilter.parse("hang<3")


def test_ring_keeps_the_newest_and_marks_gaps() -> None:
    ring = Ring(3)
    for value in (1.0, Unavailable("x"), 3.0, 4.0):
        ring.append(value)
    assert ring.values() == [None, 3.0, 4.0]
    assert ring.numbers() == [3.0, 4.0]
    with pytest.raises(ValueError):
        Ring(0)


def test_recording_lines_round_trip_and_bad_lines_name_file_and_line(tmp_path) -> None:
    events = [
        SnapshotReceived("a:1", 1.5, (snapshot_pb())),
        HostUnreachable("a:1", 2.5, "cannot connect"),
    ]
    path = tmp_path / "rec.ndjson"
    path.write_text("".join(record.encode(e) + "\n" for e in events) + '{"event": "nope"}\n')
    reader = record.read(path)
    assert [next(reader), next(reader)] == events
    with pytest.raises(record.RecordFormatError, match=r"rec.ndjson:3: not a tuiprof recording line"):
        next(reader)
    with pytest.raises(record.RecordFormatError, match="cannot open recording"):
        list(record.read(tmp_path / "missing.ndjson"))


def test_units() -> None:
    assert units.bytes_(80 * 2**30) == "80.0 GiB"
    assert units.bytes_per_s(12.3e9) == "12.3 GB/s"
    assert units.seconds(0.00085) == "850 µs"
    assert units.seconds(1.24) == "1.24 s"
    assert units.percent(37.4) == "37%"
    assert units.watts(Unavailable("no GPU")) == units.NA


def test_backoff_grows_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial=0.5, maximum=3.0, jitter=0.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_strings_from_an_agent_become_the_model_escaped_whatever_the_agent_did():
    """An older agent may send another user's text raw: the console escapes it where it becomes the model."""
    from agentd.proto import tuiprof_agent_pb2 as pb
    from tuiprof.model import convert
    from tuiprof.model.messages import GemmOpStats

    raw = pb.GemmOpStats(op="x\x1b]52;c;aGk=\x07\x1b[K", dtype="bf16")
    model = convert.from_proto(GemmOpStats, raw)
    assert model.op == "x\\x1b]52;c;aGk=\\x07\\x1b[K" and model.dtype == "bf16"
    down = pb.CollectorStatus(name="gpu", available=False, reason="why\x1b[2J")
    snapshot = convert.from_proto(HostSnapshot, pb.HostSnapshot(hostname="n1", collectors=[down]))
    assert str(snapshot.missing("gpu")) == "unavailable: why\\x1b[2J"
