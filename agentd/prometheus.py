"""The agent's latest snapshot in Prometheus's text exposition format (version 0.0.4).

Names follow Prometheus conventions: prefix ``tuiprof_``, base units as the
suffix (``_bytes``, ``_seconds``, ``_hertz``, ``_watts``, ``_celsius``), 0-1
fractions as ``_ratio``, counters (monotonic since boot or driver load) end in
``_total`` so that ``rate()`` works at any scrape interval. Every series has a
``hostname`` label; GPU series add ``gpu`` (index) and ``uuid``.

A value the agent could not read is left out of the output -- never written as
0. Whether each collector works, and why not, is ``tuiprof_collector_up``.

The output is built section by section (one function per part of the snapshot,
listed in ``SECTIONS``); per-rank families belong in a section of their own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from agentd.proto import tuiprof_agent_pb2 as pb

PREFIX = "tuiprof_"
Labels = dict[str, str]


@dataclasses.dataclass
class Family:
    """One metric family: its HELP and TYPE lines and its samples."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: list[tuple[Labels, float]] = dataclasses.field(default_factory=list)

    def add(self, labels: Labels, value: float | int | None) -> None:
        """Add a sample; None (an unavailable reading) adds nothing."""
        if value is not None:
            self.samples.append((labels, value))


def optional(message: Any, field: str, scale: float = 1) -> float | int | None:
    """``message.field`` times ``scale``, or None when the field is unset (unavailable)."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    return value if scale == 1 else value * scale


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def format_family(family: Family) -> str:
    lines = [
        f"# HELP {family.name} {family.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}",
        f"# TYPE {family.name} {family.kind}",
    ]
    for labels, value in family.samples:
        rendered = ",".join(f'{key}="{escape_label_value(text)}"' for key, text in labels.items())
        lines.append(f"{family.name}{{{rendered}}} {format_value(value)}" if rendered else f"{family.name} {format_value(value)}")
    return "\n".join(lines) + "\n"


class Families:
    """Families by name, created on first use, in the order they were first used."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}

    def __call__(self, name: str, kind: str, help: str) -> Family:
        full = PREFIX + name
        family = self._families.get(full)
        if family is None:
            family = self._families[full] = Family(full, kind, help)
        return family

    def render(self) -> str:
        return "".join(format_family(f) for f in self._families.values() if f.samples)


# ---------------------------------------------------------------- sections


def _agent(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    out("agent_info", "gauge", "Agent and driver versions (value is always 1).").add(
        {
            **host,
            "version": info.agent_version,
            "driver_version": info.driver_version,
            "nvml_version": info.nvml_version,
            "cuda_driver_version": info.cuda_driver_version,
        },
        1,
    )
    up = out("collector_up", "gauge", "1 when the collector works, 0 when not (reason label says why).")
    for status in snapshot.collectors:
        up.add({**host, "collector": status.name, "reason": status.reason}, int(status.available))
    out("snapshot_timestamp_seconds", "gauge", "When the agent assembled the snapshot (Unix time).").add(
        host, snapshot.timestamp_unix_ns / 1e9
    )


_CPU_MODES = (("user", "user_percent"), ("system", "system_percent"), ("idle", "idle_percent"), ("iowait", "iowait_percent"))


def _cpu(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    if not snapshot.HasField("cpu"):
        return
    cpu = snapshot.cpu
    total = out("cpu_usage_ratio", "gauge", "Share of all CPUs' time per mode over the last interval.")
    for mode, field in _CPU_MODES:
        total.add({**host, "mode": mode}, optional(cpu, field, 0.01))
    per_core = out("cpu_core_usage_ratio", "gauge", "Share of one CPU's time per mode over the last interval.")
    for core in cpu.cores:
        for mode, field in _CPU_MODES:
            per_core.add({**host, "cpu": str(core.cpu), "mode": mode}, optional(core, field, 0.01))
    for period in ("1", "5", "15"):
        out(f"load{period}", "gauge", f"Load average over {period} minute(s).").add(host, optional(cpu, f"load{period}"))
    out("processes", "gauge", "Number of processes.").add(host, optional(cpu, "process_count"))


def _memory(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    if not snapshot.HasField("memory"):
        return
    memory = snapshot.memory
    for name, field, help in (
        ("memory_total_bytes", "total_bytes", "Physical memory."),
        ("memory_used_bytes", "used_bytes", "Memory in use (total minus available)."),
        ("memory_available_bytes", "available_bytes", "Memory available to new work without swapping."),
        ("swap_total_bytes", "swap_total_bytes", "Swap space."),
        ("swap_used_bytes", "swap_used_bytes", "Swap space in use."),
    ):
        out(name, "gauge", help).add(host, optional(memory, field))


def _network(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    counters = (
        ("network_receive_bytes_total", "rx_bytes_total", "Bytes received."),
        ("network_transmit_bytes_total", "tx_bytes_total", "Bytes sent."),
        ("network_receive_errors_total", "rx_errors_total", "Receive errors."),
        ("network_transmit_errors_total", "tx_errors_total", "Transmit errors."),
        ("network_receive_drops_total", "rx_drops_total", "Received packets dropped."),
        ("network_transmit_drops_total", "tx_drops_total", "Outgoing packets dropped."),
    )
    for nic in snapshot.nics:
        for name, field, help in counters:
            out(name, "counter", help).add({**host, "nic": nic.name}, optional(nic, field))


def _disks(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    counters = (
        ("disk_read_bytes_total", "read_bytes_total", "Bytes read from the disk."),
        ("disk_written_bytes_total", "write_bytes_total", "Bytes written to the disk."),
        ("disk_reads_completed_total", "reads_total", "Read requests completed."),
        ("disk_writes_completed_total", "writes_total", "Write requests completed."),
        ("disk_io_time_seconds_total", "busy_seconds_total", "Time with I/O in flight."),
    )
    for disk in snapshot.disks:
        for name, field, help in counters:
            out(name, "counter", help).add({**host, "disk": disk.name}, optional(disk, field))


_GPU_GAUGES = (
    ("gpu_utilization_ratio", "utilization_percent", 0.01, "Share of time a kernel ran (NVML utilization)."),
    ("gpu_memory_utilization_ratio", "memory_utilization_percent", 0.01, "Share of time device memory was read or written."),
    ("gpu_memory_used_bytes", "memory_used_bytes", 1, "Device memory in use."),
    ("gpu_memory_total_bytes", "memory_total_bytes", 1, "Device memory."),
    ("gpu_power_watts", "power_watts", 1, "Board power draw."),
    ("gpu_power_limit_watts", "power_limit_watts", 1, "Enforced power limit."),
    ("gpu_temperature_celsius", "temperature_celsius", 1, "GPU temperature."),
    ("gpu_sm_clock_hertz", "sm_clock_hz", 1, "SM clock."),
    ("gpu_memory_clock_hertz", "memory_clock_hz", 1, "Memory clock."),
    ("gpu_graphics_active_ratio", "graphics_active_percent", 0.01, "GPM: share of time the graphics/compute engine was active."),
    ("gpu_sm_active_ratio", "sm_active_percent", 0.01, "GPM: share of cycles an SM had a warp resident, averaged over SMs."),
    ("gpu_sm_occupancy_ratio", "sm_occupancy_percent", 0.01, "GPM: resident warps over the maximum, averaged over SMs."),
    ("gpu_dram_active_ratio", "dram_active_percent", 0.01, "GPM: DRAM bandwidth used over the maximum."),
    ("gpu_gpm_window_seconds", "gpm_window_seconds", 1, "Length of the window the GPM values average over."),
)
_GPU_PIPES = (("tensor", "tensor_active_percent"), ("fp16", "fp16_active_percent"),
              ("fp32", "fp32_active_percent"), ("fp64", "fp64_active_percent"))


def _gpus(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    for gpu in snapshot.gpus:
        labels = {**host, "gpu": str(gpu.index), "uuid": gpu.uuid}
        out("gpu_info", "gauge", "GPU identity (value is always 1).").add(
            {**labels, "name": gpu.name, "pci_bus_id": gpu.pci_bus_id}, 1
        )
        for name, field, scale, help in _GPU_GAUGES:
            out(name, "gauge", help).add(labels, optional(gpu, field, scale))
        pipes = out("gpu_pipe_active_ratio", "gauge", "GPM: share of cycles a pipe (tensor, fp16, fp32, fp64) was active.")
        for pipe, field in _GPU_PIPES:
            pipes.add({**labels, "pipe": pipe}, optional(gpu, field, 0.01))
        if gpu.HasField("clock_event_reasons_mask"):
            reasons = out("gpu_clock_event_reason", "gauge", "1 for each reason the clocks are held down now (throttling).")
            for reason in gpu.clock_event_reasons:
                reasons.add({**labels, "reason": reason}, 1)
        ecc = out("gpu_ecc_errors_total", "counter", "ECC errors since the driver loaded.")
        ecc.add({**labels, "type": "corrected"}, optional(gpu, "ecc_corrected_total"))
        ecc.add({**labels, "type": "uncorrected"}, optional(gpu, "ecc_uncorrected_total"))
        nvlink = out("gpu_nvlink_bytes_total", "counter", "NVLink data bytes over all links (NVML counters).")
        pcie = out("gpu_pcie_throughput_bytes_per_second", "gauge", "PCIe traffic (GPM window average, else NVML's 20 ms sample).")
        gpm_nvlink = out("gpu_gpm_nvlink_throughput_bytes_per_second", "gauge", "GPM: NVLink traffic over all links.")
        for direction in ("rx", "tx"):
            directed = {**labels, "direction": direction}
            nvlink.add(directed, optional(gpu, f"nvlink_{direction}_bytes_total"))
            pcie.add(directed, optional(gpu, f"pcie_{direction}_bytes_per_s"))
            gpm_nvlink.add(directed, optional(gpu, f"gpm_nvlink_{direction}_bytes_per_s"))
        memory = out("gpu_process_memory_used_bytes", "gauge", "Device memory used by one process.")
        for process in gpu.processes:
            memory.add({**labels, "pid": str(process.pid), "process": process.name}, optional(process, "used_memory_bytes"))


_PMU_GAUGES = (
    ("pmu_instructions_per_second", "mips", 1e6, "Instructions retired per second (this interval, all counted CPUs)."),
    ("pmu_cycles_per_second", "mega_cycles_per_s", 1e6, "Unhalted CPU cycles per second (this interval, all counted CPUs)."),
    ("pmu_instructions_per_cycle", "ipc", 1, "Instructions per cycle over the interval."),
    ("pmu_cache_misses_per_second", "cache_misses_per_s", 1, "Last-level cache misses per second."),
    ("pmu_cache_miss_ratio", "cache_miss_percent", 0.01, "Cache misses over cache references."),
    ("pmu_branch_misses_per_second", "branch_misses_per_s", 1, "Mispredicted branches per second."),
    ("pmu_task_clock_seconds_per_second", "task_clock_cpus", 1, "CPU time of the counted processes per second."),
    ("pmu_context_switches_per_second", "context_switches_per_s", 1, "Context switches per second."),
    ("pmu_page_faults_per_second", "page_faults_per_s", 1, "Page faults per second."),
    ("pmu_cpu_migrations_per_second", "cpu_migrations_per_s", 1, "Task migrations between CPUs per second."),
)


def _pmu(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    if not snapshot.HasField("pmu"):
        return
    pmu = snapshot.pmu
    labels = {**host, "scope": pmu.scope}
    out("pmu_hardware_available", "gauge", "1 when hardware PMU counters work, 0 when not (reason label says why).").add(
        {**labels, "reason": pmu.hardware_reason}, int(pmu.hardware_available)
    )
    for name, field, scale, help in _PMU_GAUGES:
        out(name, "gauge", help).add(labels, optional(pmu, field, scale))


_LATENCY_STATS = ("avg", "min", "max", "p50", "p99")


def _latency(out: Families, prefix: str, what: str, labels: Labels, latency: pb.LatencyStats) -> None:
    for stat in _LATENCY_STATS:
        out(f"{prefix}_latency_{stat}_seconds", "gauge", f"{stat} kernel time of one {what} over the interval.").add(
            labels, optional(latency, f"{stat}_seconds"))


def _ranks(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """Per-rank families (from agentd.collectors.ranks), comparable to xpu-timer's."""
    for rank in snapshot.ranks:
        labels = {**host, "pid": str(rank.pid),
                  "rank": str(rank.rank) if rank.HasField("rank") else "",
                  "local_rank": str(rank.local_rank) if rank.HasField("local_rank") else ""}
        out("rank_info", "gauge", "A rank's process (value 1); state: running, exited, stopped, zombie, disk-sleep.").add(
            {**labels, "job_id": rank.job_id, "state": rank.state}, 1)
        out("rank_heartbeat_age_seconds", "gauge", "Seconds since the rank's telemetry writer last beat.").add(
            labels, rank.heartbeat_age_seconds)
        out("rank_steps_total", "counter", "Optimizer steps the rank finished.").add(labels, rank.step_count)
        out("rank_step_time_seconds", "gauge", "Median time of the rank's recent steps.").add(
            labels, optional(rank, "step_time_seconds"))
        out("rank_gemm_tflops", "gauge", "Achieved GEMM kernel throughput over the interval (all GEMMs).").add(
            labels, optional(rank, "gemm_tflops"))
        out("rank_gc_pause_seconds_per_second", "gauge", "Python GC pause time per second.").add(
            labels, optional(rank, "gc_pause_seconds_per_s"))
        out("rank_dataloader_wait_seconds_per_second", "gauge", "DataLoader wait time per second.").add(
            labels, optional(rank, "dataloader_wait_seconds_per_s"))
        if rank.HasField("pmu"):
            out("rank_pmu_hardware_available", "gauge",
                "1 when the rank's hardware PMU counters work, 0 when not (reason label says why).").add(
                {**labels, "reason": rank.pmu.hardware_reason}, int(rank.pmu.hardware_available))
            for name, field, scale, help in _PMU_GAUGES:
                out(f"rank_{name}", "gauge", f"{help} This rank's threads.").add(
                    labels, optional(rank.pmu, field, scale))
        for op in rank.inflight:
            out("rank_inflight_age_seconds", "gauge", "Age of the oldest unfinished op per stream / communicator.").add(
                {**labels, "kind": op.kind, "op": op.op, "comm": op.comm_hash, "stream": str(op.stream)},
                op.age_seconds)
        for gemm in rank.gemm:
            g = {**labels, "op": gemm.op, "dtype": gemm.dtype, "shape": gemm.shape}
            out("rank_gemm_calls_total", "counter", "GEMM calls.").add(g, gemm.count_total)
            out("rank_gemm_calls_per_second", "gauge", "GEMM calls per second over the interval.").add(g, gemm.count_per_s)
            out("rank_gemm_op_tflops", "gauge", "Achieved kernel throughput of these GEMMs over the interval.").add(
                g, optional(gemm, "tflops"))
            _latency(out, "rank_gemm", "GEMM", g, gemm.latency)
        for coll in rank.nccl:
            c = {**labels, "op": coll.op, "dtype": coll.dtype, "algorithm": coll.algorithm,
                 "protocol": coll.protocol, "comm": coll.comm_hash, "comm_size": str(coll.comm_size)}
            out("rank_nccl_calls_total", "counter", "NCCL collective / p2p calls.").add(c, coll.count_total)
            out("rank_nccl_calls_per_second", "gauge", "NCCL calls per second over the interval.").add(c, coll.count_per_s)
            out("rank_nccl_bytes_total", "counter", "Bytes moved (nccl-tests size).").add(c, coll.bytes_total)
            out("rank_nccl_algbw_bytes_per_second", "gauge", "Algorithm bandwidth over the interval.").add(
                c, optional(coll, "algbw_bytes_per_s"))
            out("rank_nccl_busbw_bytes_per_second", "gauge", "Bus bandwidth (nccl-tests factors) over the interval.").add(
                c, optional(coll, "busbw_bytes_per_s"))
            _latency(out, "rank_nccl", "collective", c, coll.latency)


Section = Callable[[Families, pb.HostSnapshot, pb.AgentInfo, Labels], None]

# One renderer per part of the snapshot; per-rank families (GEMM, NCCL) get their own.
SECTIONS: tuple[Section, ...] = (_agent, _cpu, _memory, _network, _disks, _gpus, _pmu, _ranks)


def render_metrics(snapshot: pb.HostSnapshot, info: pb.AgentInfo) -> str:
    """The exposition text for one snapshot (``info`` supplies versions)."""
    out = Families()
    host = {"hostname": snapshot.hostname or info.hostname}
    for section in SECTIONS:
        section(out, snapshot, info, host)
    return out.render()
