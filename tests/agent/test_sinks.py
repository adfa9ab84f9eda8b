"""The JSON-lines sink: dynolog-compatible names, absent-not-zero, and a real agent writing it."""

from __future__ import annotations

import json
import time

import psutil

from agentd import sinks
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.sinks import dynolog_record
from testkit.agents import running_agent


def snapshot(sequence: int, at_s: float, lo_rx: int) -> pb.HostSnapshot:
    snap = pb.HostSnapshot(hostname="node1", sequence=sequence, timestamp_unix_ns=int(at_s * 1e9))
    snap.cpu.user_percent, snap.cpu.system_percent, snap.cpu.idle_percent = 12.5, 2.5, 80.0
    snap.cpu.unavailable["iowait_percent"] = "not reported by this kernel"
    snap.cpu.uptime_seconds, snap.cpu.guest_percent, snap.cpu.steal_percent = at_s, 1.5, 0.5
    snap.cpu.seconds_total.user, snap.cpu.seconds_total.steal = 10.0 * at_s, 0.25 * at_s
    snap.cpu.interrupts_total = lo_rx * 2
    snap.memory.total_bytes = 8 << 30
    snap.nics.add(name="lo", rx_bytes_total=lo_rx, tx_bytes_total=lo_rx, rx_packets_total=lo_rx // 100)
    snap.nics.add(name=f"new{sequence}", rx_bytes_total=5)
    gpu = snap.gpus.add(index=1, name="H200", uuid="GPU-1", sm_clock_hz=1.98e9, power_watts=350.0,
                        sm_active_percent=50.0, graphics_active_percent=75.0, nvlink_rx_bytes_per_s=1e9)
    gpu.unavailable["tensor_active_percent"] = "GPM not supported"
    snap.pmu.mips = 1234.0
    snap.collectors.add(name="host", available=True)
    snap.collectors.add(name="ranks", available=False, reason="no ranks registered")
    return snap


def test_record_uses_dynolog_names_and_leaves_unreadable_values_out():
    first, second = snapshot(1, 100.0, 1000), snapshot(2, 101.0, 4000)
    record = dynolog_record(second, first)
    assert record["cpu_u"] == 12.5 and record["cpu_s"] == 2.5 and record["cpu_i"] == 80.0
    assert record["cpu_util"] == 20.0
    assert "cpu_w" not in record  # unavailable: absent, never 0
    assert record["mem_total"] == 8 << 30
    assert record["rx_bytes.lo"] == 3000 and record["tx_bytes.lo"] == 3000  # per-interval deltas
    assert "rx_bytes.new2" not in record  # a device without a previous value has no delta
    assert record["interval_s"] == 1.0
    assert record["uptime"] == 101.0 and record["cpu_guest"] == 1.5 and record["cpu_z"] == 0.5
    assert record["cpu_u_ms"] == 10000.0 and record["cpu_z_ms"] == 250.0 and record["cpu_x_ms"] == 0.0
    assert record["interrupts"] == 6000 and record["rx_packets.lo"] == 30
    assert "tx_packets.lo" not in record and "softirqs" not in record  # never read: no delta, not 0
    assert record["mips"] == 1234.0
    assert record["gpu_name.1"] == "H200" and record["gpu_uuid.1"] == "GPU-1"
    assert record["gpu_frequency_mhz.1"] == 1980.0 and record["gpu_power_draw.1"] == 350.0
    assert record["sm_active_ratio.1"] == 0.5 and record["nvlink_rx_bytes.1"] == 1e9
    assert record["graphics_engine_active_ratio.1"] == 0.75
    assert "tensorcore_active.1" not in record
    assert record["unavailable"] == {"ranks": "no ranks registered"}
    assert (record["hostname"], record["sequence"]) == ("node1", 2)


def with_nodes_rdma_and_gpu_ids(snap: pb.HostSnapshot, rcv_errors: int) -> pb.HostSnapshot:
    """``snap`` plus two NUMA nodes (one just seen), two RDMA ports, pause frames and the GPU's ids and errors."""
    snap.cpu.numa_nodes.add(node=0, cpus=[0, 1], user_percent=30.0, system_percent=5.0, idle_percent=60.0)
    node1 = snap.cpu.numa_nodes.add(node=1, cpus=[2, 3])
    node1.unavailable["user_percent"] = "first sample"
    ib = snap.rdma.ports.add(device="mlx5_0", port=1, netdev="ib0")
    ib.counters.add(name="port_rcv_errors", value=rcv_errors)
    ib.hw_counters.add(name="np_cnp_sent", value=10 * rcv_errors)
    ib.hw_counters.add(name="rx_icrc_encapsulated").unavailable["value"] = "Invalid argument"
    snap.rdma.ports.add(device="mlx5_1", port=1).counters.add(name="port_xmit_discards", value=rcv_errors)
    snap.nics[0].ethtool_stats.add(name="tx_prio3_pause", value=2 * rcv_errors)
    snap.gpus[0].minor_number = 3
    snap.gpus[0].nvml_failed_queries = rcv_errors % 2
    return snap


def test_numa_rdma_and_gpu_ids_under_dynolog_names():
    first = with_nodes_rdma_and_gpu_ids(snapshot(1, 100.0, 1000), 4)
    second = with_nodes_rdma_and_gpu_ids(snapshot(2, 101.0, 4000), 7)
    record = dynolog_record(second, first)
    assert (record["cpu_u_node0"], record["cpu_s_node0"], record["cpu_i_node0"]) == (30.0, 5.0, 60.0)
    assert not any(key.endswith("_node1") for key in record)  # unavailable: absent, never 0
    assert record["ib0.port_rcv_errors"] == 3 and record["ib0.np_cnp_sent"] == 30  # deltas, named by netdev
    assert record["mlx5_1.port_xmit_discards"] == 3  # no netdev: named by the device
    assert record["lo.tx_prio3_pause"] == 6  # the NIC driver's pause frames, as dynolog names them
    assert "ib0.rx_icrc_encapsulated" not in record  # unreadable: absent, never 0
    assert record["minor_id.1"] == 3 and record["dcgm_error.1"] == 1
    assert dynolog_record(first, None)["dcgm_error.1"] == 0
    assert not any(key.startswith("ib0.") for key in dynolog_record(first, None))  # no previous: no delta
    reset = dynolog_record(with_nodes_rdma_and_gpu_ids(snapshot(3, 102.0, 5000), 1), second)
    assert "ib0.port_rcv_errors" not in reset  # counters reset: no delta, not a negative one


def test_first_record_and_counter_resets_have_no_deltas():
    assert not any(key.startswith("rx_bytes") for key in dynolog_record(snapshot(1, 1.0, 10), None))
    reset = dynolog_record(snapshot(2, 2.0, 5), snapshot(1, 1.0, 10))
    assert "rx_bytes.lo" not in reset and "interrupts" not in reset
    assert "cpu_u_ms" not in dynolog_record(snapshot(2, 1.0, 10), snapshot(1, 2.0, 10))  # CPU time went back


def test_agent_writes_one_json_object_per_interval(tmp_path):
    sink = tmp_path / "metrics.jsonl"
    with running_agent(tmp_path, extra_args=["--json-sink", str(sink)], interval_ms=200):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(sink.read_text().splitlines()) < 6:
            time.sleep(0.1)
    lines = sink.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is a complete JSON object
    assert len(records) >= 6
    sequences = [r["sequence"] for r in records]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    later = records[-1]
    assert 0 <= later["cpu_u"] <= 100 and 0 <= later["cpu_i"] <= 100
    assert later["mem_total"] == psutil.virtual_memory().total
    assert 0.1 < later["interval_s"] < 0.5
    assert "rx_bytes.lo" in later and later["rx_bytes.lo"] >= 0 and later["rx_packets.lo"] >= 0
    assert later["uptime"] > 0
    # one quiet 200 ms interval may see no interrupt (tickless idle); the whole run sees some
    # (a delta needs two host samples: under load the first records may come before the second one)
    first = next(i for i, r in enumerate(records) if "interrupts" in r)
    counted = records[first:]
    assert all("interrupts" in r and r["interrupts"] >= 0 for r in counted)
    assert sum(r["interrupts"] for r in counted) > 0
    # ms of CPU time in one interval: at most the interval times the CPUs (plus a tick of slack each)
    assert 0 <= later["cpu_u_ms"] + later["cpu_s_ms"] <= (later["interval_s"] + 0.02) * 1000 * psutil.cpu_count()
    assert "gpu" in later.get("unavailable", {}) or any(k.startswith("gpu_name.") for k in later)


def test_a_sink_file_past_its_bound_moves_to_dot_1_and_a_new_one_starts(tmp_path, monkeypatch):
    path, previous = tmp_path / "metrics.jsonl", tmp_path / "metrics.jsonl.1"
    path.write_text('{"left":"by an earlier run"}\n')
    bound = 1000  # a record here is 350-400 bytes: a file holds about three
    monkeypatch.setattr(sinks, "ROTATE_BYTES", bound)
    sink = sinks.JsonLinesSink.open(str(path))
    try:
        for sequence in range(1, 12):
            sink.write(snapshot(sequence, float(sequence), 10 * sequence))
    finally:
        sink.close()
    older = [json.loads(line) for line in previous.read_text().splitlines()]
    newer = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [r["sequence"] for r in older + newer]
    assert kept == list(range(12 - len(kept), 12)) and len(kept) < 11  # the newest, in order; older ones dropped
    assert 1 <= len(older) <= 4 and len(newer) <= 4
    longest = max(len(line) + 1 for line in previous.read_text().splitlines())
    assert bound < previous.stat().st_size <= bound + longest  # rotated as soon as it passed the bound
    assert path.stat().st_size <= bound
    assert newer and newer[0]["rx_bytes.lo"] == 10  # deltas go on across a rotation
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.jsonl.1"]


def test_stdout_is_never_rotated(monkeypatch, capsys):
    monkeypatch.setattr(sinks, "ROTATE_BYTES", 1)
    sink = sinks.JsonLinesSink.open("-")
    for sequence in (1, 2):
        sink.write(snapshot(sequence, float(sequence), 10))
    sink.close()
    assert [json.loads(line)["sequence"] for line in capsys.readouterr().out.splitlines()] == [1, 2]
