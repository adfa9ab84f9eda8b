"""render_metrics: valid exposition text (checked by promtool), base units, absent values left out."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time

import httpx
import pytest

from agentd.agent import Agent
from agentd.collectors.gpu import GpuCollector
from agentd.collectors.host import HostCollector
from agentd.collectors.pmu import PmuCollector
from agentd.metrics_http import consecutive_snapshots
from agentd.prometheus import DYNOLOG_HOST_GAUGES, DYNOLOG_NIC_GAUGES, render_dynolog_metrics, render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.agents import running_agent

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt package prometheus)")

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of an exposition text as (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = dict(LABEL.findall(match["labels"] or ""))
        samples.append((match["name"], labels, float(match["value"])))
    return samples


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


def live_snapshot() -> tuple[pb.HostSnapshot, pb.AgentInfo]:
    """A snapshot from the real collectors of this machine, two samples apart."""
    collectors = [HostCollector(1.0), PmuCollector(1.0), GpuCollector(1.0)]
    try:
        for collector in collectors:
            collector.collect()
        time.sleep(0.3)
        snapshot = pb.HostSnapshot(hostname=socket.gethostname(), timestamp_unix_ns=time.time_ns())
        info = pb.AgentInfo(hostname=snapshot.hostname, agent_version="test")
        for collector in collectors:
            collector.collect()
            snapshot.collectors.append(collector.status())
            collector.fill(snapshot)
            collector.describe(info)
    finally:
        for collector in collectors:
            collector.close()
    return snapshot, info


@needs_promtool
def test_live_output_passes_promtool() -> None:
    snapshot, info = live_snapshot()
    text = render_metrics(snapshot, info)
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {name for name, _, _ in parse(text)}
    assert {"tuiprof_cpu_usage_ratio", "tuiprof_memory_total_bytes", "tuiprof_network_receive_bytes_total",
            "tuiprof_collector_up", "tuiprof_load1"} <= names


def test_every_series_carries_the_hostname_and_counters_end_in_total() -> None:
    snapshot, info = live_snapshot()
    text = render_metrics(snapshot, info)
    for name, labels, _ in parse(text):
        assert labels["hostname"] == socket.gethostname(), name
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert all(name.endswith("_total") for name, kind in types.items() if kind == "counter")
    assert types["tuiprof_network_receive_bytes_total"] == "counter"
    assert types["tuiprof_memory_total_bytes"] == "gauge"


def test_collector_status_is_a_gauge_with_the_reason() -> None:
    snapshot = pb.HostSnapshot(hostname="h")
    snapshot.collectors.add(name="host", available=True)
    snapshot.collectors.add(name="gpu", available=False, reason="NVML: Driver Not Loaded")
    samples = parse(render_metrics(snapshot, pb.AgentInfo()))
    up = {labels["collector"]: (labels["reason"], value) for name, labels, value in samples if name == "tuiprof_collector_up"}
    assert up == {"host": ("", 1.0), "gpu": ("NVML: Driver Not Loaded", 0.0)}


def test_unavailable_readings_are_left_out_not_zero() -> None:
    snapshot = pb.HostSnapshot(hostname="h")
    snapshot.cpu.system_percent = 0.0  # a real zero stays
    snapshot.cpu.unavailable["user_percent"] = "first sample"
    snapshot.memory.total_bytes = 8 << 30
    nic = snapshot.nics.add(name="eth0", rx_bytes_total=5)
    nic.unavailable["tx_bytes_total"] = "not reported"
    gpu = snapshot.gpus.add(index=0, uuid="GPU-1", name="Test GPU", utilization_percent=50.0)
    gpu.unavailable["sm_active_percent"] = "GPM needs Hopper or newer (Ampere)"
    samples = parse(render_metrics(snapshot, pb.AgentInfo()))
    names = [name for name, _, _ in samples]
    cpu_modes = {labels["mode"]: value for name, labels, value in samples if name == "tuiprof_cpu_usage_ratio"}
    assert cpu_modes == {"system": 0.0}
    assert "tuiprof_network_transmit_bytes_total" not in names
    assert "tuiprof_network_receive_bytes_total" in names
    assert "tuiprof_gpu_sm_active_ratio" not in names
    assert "tuiprof_gpu_power_watts" not in names
    assert "tuiprof_memory_used_bytes" not in names
    assert ("tuiprof_gpu_utilization_ratio", {"hostname": "h", "gpu": "0", "uuid": "GPU-1"}, 0.5) in samples


@needs_promtool
def test_gpu_families_use_base_units_and_pass_promtool() -> None:
    snapshot = pb.HostSnapshot(hostname="gpu-host")
    gpu = snapshot.gpus.add(
        index=1, uuid="GPU-abc", name="NVIDIA H200", pci_bus_id="00000000:19:00.0",
        utilization_percent=99.0, memory_used_bytes=1 << 30, memory_total_bytes=141 << 30,
        power_watts=650.5, power_limit_watts=700.0, temperature_celsius=55.0,
        sm_clock_hz=1.98e9, memory_clock_hz=3.2e9, clock_event_reasons_mask=0x4,
        ecc_corrected_total=0, ecc_uncorrected_total=0,
        nvlink_rx_bytes_total=10 << 30, nvlink_tx_bytes_total=11 << 30,
        sm_active_percent=59.8, tensor_active_percent=40.0, fp32_active_percent=1.0,
        pcie_tx_bytes_per_s=6.8e9, gpm_window_seconds=1.0,
    )
    gpu.clock_event_reasons.append("sw_power_cap")
    gpu.processes.add(pid=1213, name="python3", used_memory_bytes=1_950_000_000)
    text = render_metrics(snapshot, pb.AgentInfo(driver_version="580.159.04"))
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr
    values = {(name, tuple(sorted(labels.items()))): value for name, labels, value in parse(text)}
    base = (("gpu", "1"), ("hostname", "gpu-host"), ("uuid", "GPU-abc"))
    assert values[("tuiprof_gpu_utilization_ratio", base)] == 0.99
    assert values[("tuiprof_gpu_sm_active_ratio", base)] == pytest.approx(0.598)
    assert values[("tuiprof_gpu_sm_clock_hertz", base)] == 1.98e9
    assert values[("tuiprof_gpu_pipe_active_ratio", tuple(sorted(base + (("pipe", "tensor"),))))] == 0.4
    assert values[("tuiprof_gpu_clock_event_reason", tuple(sorted(base + (("reason", "sw_power_cap"),))))] == 1
    assert values[("tuiprof_gpu_nvlink_bytes_total", tuple(sorted(base + (("direction", "tx"),))))] == 11 << 30
    assert values[("tuiprof_gpu_pcie_throughput_bytes_per_second", tuple(sorted(base + (("direction", "tx"),))))] == 6.8e9
    assert ("tuiprof_gpu_pcie_throughput_bytes_per_second", tuple(sorted(base + (("direction", "rx"),)))) not in values
    memory_key = tuple(sorted(base + (("pid", "1213"), ("process", "python3"), ("container", ""))))
    assert values[("tuiprof_gpu_process_memory_used_bytes", memory_key)] == 1_950_000_000


@needs_promtool
def test_label_values_are_escaped() -> None:
    snapshot = pb.HostSnapshot(hostname="h")
    snapshot.nics.add(name='we"ird\\nic\nx', rx_bytes_total=1)
    text = render_metrics(snapshot, pb.AgentInfo())
    assert 'nic="we\\"ird\\\\nic\\nx"' in text
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rank_pmu_families_pass_promtool_and_leave_out_unavailable() -> None:
    snapshot = pb.HostSnapshot(hostname="h")
    rank = snapshot.ranks.add(pid=42, rank=3, local_rank=1, state=pb.RANK_STATE_RUNNING)
    rank.pmu.scope = "process"
    rank.pmu.hardware_reason = "ENOENT: no PMU"
    rank.pmu.task_clock_cpus = 0.97
    rank.pmu.context_switches_per_s = 0.0  # a real zero stays
    rank.pmu.unavailable["ipc"] = "hardware counters unavailable: ENOENT: no PMU"
    snapshot.ranks.add(pid=43, state=pb.RANK_STATE_RUNNING).unavailable["pmu"] = "CPU counters for pid 43 could not be opened"
    text = render_metrics(snapshot, pb.AgentInfo())
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr
    samples = parse(text)
    labels = {"hostname": "h", "pid": "42", "rank": "3", "local_rank": "1"}
    assert ("tuiprof_rank_pmu_task_clock_seconds_per_second", labels, 0.97) in samples
    assert ("tuiprof_rank_pmu_context_switches_per_second", labels, 0.0) in samples
    assert ("tuiprof_rank_pmu_hardware_available", {**labels, "reason": "ENOENT: no PMU"}, 0.0) in samples
    assert not [s for s in samples if s[0] == "tuiprof_rank_pmu_instructions_per_cycle"]
    assert not [s for s in samples if s[0].startswith("tuiprof_rank_pmu_") and s[1]["pid"] == "43"]


def test_hook_health_per_rank_and_an_inert_hook_exports_only_that_it_is_inert() -> None:
    snapshot = pb.HostSnapshot(hostname="h")
    active = snapshot.ranks.add(pid=42, rank=3, local_rank=1, state=pb.RANK_STATE_RUNNING)
    active.hook.cuda_timing = True
    active.hook.gemm_untimed_total = 7
    active.hook.pending = 2
    inert = snapshot.ranks.add(pid=43, rank=4, local_rank=2, state=pb.RANK_STATE_RUNNING)
    inert.hook.inactive_reason = "shared memory full: /dev/shm/tuiprof-1000-43: ENOSPC"
    snapshot.ranks.add(pid=44, state=pb.RANK_STATE_RUNNING)  # no hook message: no hook series
    text = render_metrics(snapshot, pb.AgentInfo())
    samples = parse(text)
    hook = {(name, labels["pid"]): value for name, labels, value in samples if name.startswith("tuiprof_rank_hook_")}
    assert hook[("tuiprof_rank_hook_active", "42")] == 1 and hook[("tuiprof_rank_hook_active", "43")] == 0
    assert hook[("tuiprof_rank_hook_cuda_timing", "42")] == 1 and hook[("tuiprof_rank_hook_nccl_plugin", "42")] == 0
    assert hook[("tuiprof_rank_hook_gemm_untimed_total", "42")] == 7
    assert hook[("tuiprof_rank_hook_pending_ops", "42")] == 2
    assert [name for name, pid in hook if pid == "43"] == ["tuiprof_rank_hook_active"]  # never measured: absent
    assert not [key for key in hook if key[1] == "44"]
    assert "ENOSPC" not in text  # free text from the process: not a label
    assert re.search(r"^# TYPE tuiprof_rank_hook_dropped_records_total counter$", text, re.M)


def test_hang_levels_are_one_series_per_level_and_absent_when_detection_is_off() -> None:
    off = parse(render_metrics(pb.HostSnapshot(hostname="h"), pb.AgentInfo()))
    assert not [name for name, _, _ in off if "hang" in name]
    snapshot = pb.HostSnapshot(hostname="h")
    snapshot.ranks.add(pid=42, rank=3, local_rank=1, state=pb.RANK_STATE_RUNNING)
    snapshot.hang.level = pb.HANG_LEVEL_HUNG
    snapshot.hang.ranks.add(pid=42, rank=3, level=pb.HANG_LEVEL_HUNG, explanation="AllReduce #9 for 300 s")
    samples = parse(render_metrics(snapshot, pb.AgentInfo()))
    host = {labels["level"]: value for name, labels, value in samples if name == "tuiprof_hang_status"}
    assert host == {"ok": 0, "suspect": 0, "hung": 1}
    ranks = {labels["level"]: value for name, labels, value in samples if name == "tuiprof_rank_hang_status"}
    assert ranks == {"ok": 0, "suspect": 0, "hung": 1, "exited": 0}
    rank_labels = next(labels for name, labels, _ in samples if name == "tuiprof_rank_hang_status")
    assert (rank_labels["pid"], rank_labels["rank"], rank_labels["local_rank"]) == ("42", "3", "1")  # joins rank_info
    assert not [name for name, _, _ in samples if name == "tuiprof_hang_since_timestamp_seconds"]  # since unknown


def promtool_complaints(text: str) -> set[str]:
    """promtool's lint lines for ``text`` (a text it cannot parse fails the test here)."""
    result = promtool_check(text)
    assert "error while linting" not in result.stderr, result.stderr
    return set(result.stdout.splitlines() + result.stderr.splitlines())


# dynolog's own names that promtool's lint dislikes; they are what dynolog dashboards query, so they stay.
DYNOLOG_LINT = {f"{name} metric names should not contain abbreviated units"
                for name in ("cpu_s", *(n for n in DYNOLOG_HOST_GAUGES if n.endswith("_ms")))}


def two_live_snapshots() -> tuple[pb.HostSnapshot, pb.HostSnapshot]:
    host = HostCollector(1.0)
    previous = pb.HostSnapshot(hostname="node-a", sequence=1, timestamp_unix_ns=time.time_ns())
    host.collect()
    host.fill(previous)
    time.sleep(0.2)
    host.collect()
    latest = pb.HostSnapshot(hostname="node-a", sequence=2, timestamp_unix_ns=time.time_ns())
    host.fill(latest)
    return previous, latest


@needs_promtool
def test_dynolog_names_labels_and_per_interval_values() -> None:
    previous, latest = two_live_snapshots()
    text = render_dynolog_metrics(latest, previous)
    assert promtool_complaints(text) <= DYNOLOG_LINT  # parses; only dynolog's own names are linted
    samples = {(name, labels.get("net")): (labels, value) for name, labels, value in parse(text)}
    assert {name for name, _ in samples} == set(DYNOLOG_HOST_GAUGES) - {"mips", "mega_cycles_per_second"} \
        | set(DYNOLOG_NIC_GAUGES)  # no PMU collector ran: its two gauges are absent, not 0
    assert all(labels["host_name"] == "node-a" and set(labels) <= {"host_name", "net"}
               for labels, _ in samples.values())
    cpu = latest.cpu
    assert samples[("cpu_u", None)][1] == pytest.approx(cpu.user_percent)
    assert samples[("cpu_util", None)][1] == pytest.approx(100.0 - cpu.idle_percent)
    user_ms = (cpu.seconds_total.user - previous.cpu.seconds_total.user) * 1000
    assert samples[("cpu_u_ms", None)][1] == pytest.approx(user_ms, abs=0.001)
    lo_now, lo_before = (next(n for n in s.nics if n.name == "lo") for s in (latest, previous))
    assert samples[("rx_bytes", "lo")][1] == lo_now.rx_bytes_total - lo_before.rx_bytes_total
    first = {name for name, _, _ in parse(render_dynolog_metrics(previous, None))}
    assert "cpu_u_ms" not in first and "rx_bytes" not in first and "uptime" in first  # no previous: no deltas


@needs_promtool
def test_real_agent_serves_dynolog_names_only_when_asked(tmp_path) -> None:
    def scrape(args: list[str]) -> str:
        with running_agent(tmp_path, extra_args=args, interval_ms=200) as agent:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                text = httpx.get(f"{agent.metrics_url}/metrics", timeout=5).text
                if "tuiprof_cpu_usage_ratio" in text and ("cpu_u_ms" in text or not args):
                    return text
                time.sleep(0.2)
        raise AssertionError(f"no complete exposition within 20 s: {text[:500]}")

    dynolog = scrape(["--metric-names", "dynolog"])
    assert promtool_complaints(dynolog) <= DYNOLOG_LINT
    names = {name: labels for name, labels, _ in parse(dynolog)}
    assert names["cpu_u_ms"] == {"host_name": socket.gethostname()}
    assert any(name == "rx_packets" and labels.get("net") == "lo" for name, labels, _ in parse(dynolog))
    assert "tuiprof_cpu_usage_ratio" in names  # ours follow: nothing is lost by asking for dynolog's
    ours = scrape([])
    assert promtool_complaints(ours) == set()
    assert not set(DYNOLOG_HOST_GAUGES) & {name for name, _, _ in parse(ours)}


def test_the_pair_for_deltas_is_two_consecutive_snapshots() -> None:
    agent = Agent([], interval_seconds=0.1, hostname="h")
    assert consecutive_snapshots(agent) == (None, None)
    for _ in range(3):
        agent.publish(agent.snapshot())
    latest, previous = consecutive_snapshots(agent)
    assert latest is not None and previous is not None
    assert (latest.sequence, previous.sequence) == (3, 2)
    agent.previous = agent.latest  # as read half-way through a publish: never a pair of one snapshot
    assert consecutive_snapshots(agent) == (agent.latest, None)
