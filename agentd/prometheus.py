"""The agent's latest snapshot in Prometheus's text exposition format (version 0.0.4).

Names follow Prometheus conventions: prefix ``tuiprof_``, base units as the
suffix (``_bytes``, ``_seconds``, ``_hertz``, ``_watts``, ``_celsius``), 0-1
fractions as ``_ratio``, counters (monotonic since boot or driver load) end in
``_total`` so that ``rate()`` works at any scrape interval. Every series has a
``hostname`` label; GPU series add ``gpu`` (index) and ``uuid``.

A value the agent could not read is left out of the output -- never written as
0. Whether each collector works, and why not, is ``tuiprof_collector_up``; how
long its latest ``collect()`` took and whether it succeeded, as the runner
measured it (node_exporter's scrape_collector_* pair), are
``tuiprof_collector_duration_seconds`` and ``tuiprof_collector_success``
(absent for a collector that never ran).

Per-rank series carry ``pid``, ``rank`` and ``local_rank``. The hook library's
health per rank (``RankStats.hook``): its counters as ``tuiprof_rank_hook_*_total``,
its flags as 0/1 gauges (``_cuda_timing``, ``_nccl_plugin``, ``_nccl_gpu_timers``,
``_nccl_api_fallback``, ``_nccl_api_events``),
``tuiprof_rank_hook_pending_ops``, ``tuiprof_rank_hook_nccl_profiler_api`` (the NCCL profiler
plugin API NCCL took, 0: none), and ``tuiprof_rank_hook_active`` (0 when the
hook stays inert in the process). The inert reason and a chained profiler plugin's status are NOT
labels: they are free text the training process itself writes (a path, an errno text), so as labels
they would be unbounded and user-controlled; they are in the gRPC snapshot and the
console. For an inert hook only ``_active`` is written: its counters and flags
were never measured.

Where a GPU process or a rank runs (``agentd.containers``) is one info series each,
``tuiprof_gpu_process_container_info`` and ``tuiprof_rank_container_info`` (value 1, only for
processes in a container, a pod or a SLURM job): ``pid_in_container``, ``runtime``, ``container``
(the id's first 12 hex digits, as ``docker ps`` shows it), ``pod_uid``, ``pod_namespace``,
``pod_name``, ``slurm_job``, ``slurm_step``; join them to other series on ``pid``. The per-process
memory series carries ``container`` too. These are one value per process, as the ``process`` name
already is: a process adds one series, whatever it is named.

Labels are kept bounded: states and levels come from fixed sets (hang levels are
one series per level, the StateSet pattern); free text appears only in the
``reason`` labels of collector_up / pmu_hardware_available, which the agent
writes itself and which change only when a collector breaks or recovers;
``tuiprof_rank_segments_refused``'s ``reason`` is one of ``rank_claims.REASONS``.
How many series one user's ranks add is bounded by the ranks collector's per-owner
budget of ops (``tuiprof_rank_ops_dropped{uid}`` counts what it left out). The ``function``
label of ``tuiprof_rank_function_*`` is a name from the job's configuration (at most 64 a rank,
within that budget), escaped like every label value. A rank's device memory
(``tuiprof_rank_device_*``, ``tuiprof_rank_memcpy_*``, ``tuiprof_rank_torch_*``) adds fixed sets:
``api`` is ``malloc`` or ``malloc_async``, ``direction`` one of the five copy directions.

``--metric-names dynolog`` puts dynolog's own Prometheus families first
(``render_dynolog_metrics``): its bare names, its ``host_name`` label and, per
NIC, its ``net`` label, with the values dynolog's JSON sink would log (from
``agentd.sinks.dynolog_record``: per-interval deltas need the snapshot before
the latest), so dashboards built for dynolog work unchanged.

The output is built section by section (one function per part of the snapshot,
listed in ``SECTIONS``); per-rank families belong in a section of their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any
from collections.abc import Callable

from agentd.collectors import rank_claims
from agentd.containers import short_id
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import hang_level, rank_state, slowdown_cause
from agentd.runner import CollectRun
from agentd.sinks import dynolog_record

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
    value: float | int = getattr(message, field)
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

    def __init__(self, prefix: str = PREFIX) -> None:
        self._prefix = prefix
        self._families: dict[str, Family] = {}

    def __call__(self, name: str, kind: str, help: str) -> Family:
        full = self._prefix + name
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
    calls = out("agent_nvml_calls_total", "counter",
                "The agent's own NVML calls since it started, per NVML function (rate(): calls per second).")
    for function in snapshot.nvml_calls:  # the functions the agent's code calls: a bounded set
        calls.add({**host, "function": function.function}, function.calls)


_CORE_MODES = ("user", "system", "idle", "iowait")
_CPU_MODES = (*_CORE_MODES, "nice", "irq", "softirq", "steal", "guest", "guest_nice")


def _cpu(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    if not snapshot.HasField("cpu"):
        return
    cpu = snapshot.cpu
    total = out("cpu_usage_ratio", "gauge",
                "Share of all CPUs' time per mode over the last interval (guest modes are inside user and nice).")
    for mode in _CPU_MODES:
        total.add({**host, "mode": mode}, optional(cpu, f"{mode}_percent", 0.01))
    if cpu.HasField("seconds_total"):
        seconds = out("cpu_seconds_total", "counter",
                      "All CPUs' time per mode since boot (guest modes are inside user and nice).")
        for mode in _CPU_MODES:
            seconds.add({**host, "mode": mode}, getattr(cpu.seconds_total, mode))
    per_core = out("cpu_core_usage_ratio", "gauge", "Share of one CPU's time per mode over the last interval.")
    for core in cpu.cores:
        for mode in _CORE_MODES:
            per_core.add({**host, "cpu": str(core.cpu), "mode": mode}, optional(core, f"{mode}_percent", 0.01))
    _numa_nodes(out, cpu, host)
    out("uptime_seconds", "gauge", "Time since the host booted.").add(host, optional(cpu, "uptime_seconds"))
    out("interrupts_total", "counter", "Hardware interrupts since boot, all CPUs.").add(host, optional(cpu, "interrupts_total"))
    out("softirqs_total", "counter", "Softirqs since boot, all CPUs.").add(host, optional(cpu, "softirqs_total"))
    for period in ("1", "5", "15"):
        out(f"load{period}", "gauge", f"Load average over {period} minute(s).").add(host, optional(cpu, f"load{period}"))
    out("processes", "gauge", "Number of processes.").add(host, optional(cpu, "process_count"))


_NUMA_SHARE_MODES = ("user", "system", "idle")


def _numa_nodes(out: Families, cpu: pb.CpuStats, host: Labels) -> None:
    shares = out("numa_node_cpu_usage_ratio", "gauge",
                 "Share of one NUMA node's CPUs' time per mode (user, system, idle) over the last interval.")
    seconds = out("numa_node_cpu_seconds_total", "counter", "One NUMA node's CPUs' time per mode since boot.")
    for node in cpu.numa_nodes:
        labels = {**host, "node": str(node.node)}
        for mode in _NUMA_SHARE_MODES:
            shares.add({**labels, "mode": mode}, optional(node, f"{mode}_percent", 0.01))
        if node.HasField("seconds_total"):
            for mode in _CPU_MODES:
                seconds.add({**labels, "mode": mode}, getattr(node.seconds_total, mode))


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
        ("network_receive_packets_total", "rx_packets_total", "Packets received."),
        ("network_transmit_packets_total", "tx_packets_total", "Packets sent."),
    )
    ethtool = out("network_ethtool_stat_total", "counter",
                  "A driver pause-frame counter (ethtool -S: tx_pause_ctrl_phy, tx_prio<N>_pause, tx_pause_storm_*).")
    for nic in snapshot.nics:
        for name, field, help in counters:
            out(name, "counter", help).add({**host, "nic": nic.name}, optional(nic, field))
        for stat in nic.ethtool_stats:
            ethtool.add({**host, "nic": nic.name, "stat": stat.name}, stat.value)


def _rdma(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """RDMA port counters as sysfs names them (a fixed set per driver, so ``stat`` stays bounded)."""
    port_counters = out("rdma_port_stat_total", "counter",
                        "An RDMA port counter (sysfs ports/<port>/counters; port_*_data count 4-byte words).")
    hw_counters = out("rdma_port_hw_stat_total", "counter",
                      "A driver-specific RDMA port counter (sysfs ports/<port>/hw_counters).")
    for port in snapshot.rdma.ports:
        labels = {**host, "device": port.device, "port": str(port.port), "netdev": port.netdev}
        for counter in port.counters:
            port_counters.add({**labels, "stat": counter.name}, optional(counter, "value"))
        for counter in port.hw_counters:
            hw_counters.add({**labels, "stat": counter.name}, optional(counter, "value"))


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
        out("gpu_minor_number", "gauge", "NVML minor number: the GPU is /dev/nvidia<N>.").add(
            labels, optional(gpu, "minor_number"))
        out("gpu_nvml_failed_queries", "gauge",
            "NVML queries of the latest sample that failed with an error that may pass (0: a complete sample).").add(
            labels, optional(gpu, "nvml_failed_queries"))
        out("gpu_processes_age_seconds", "gauge",
            "How old the GPU's process figures (list, memory, SM share) are: read every "
            "processes interval, slower than the other figures, and repeated in between.").add(
            labels, optional(gpu, "processes_age_seconds"))
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
        placed = out("gpu_process_container_info", "gauge",
                     "Where a GPU process runs (value 1): its pid in its container, the container, pod and SLURM job.")
        for process in gpu.processes:
            pid = {**labels, "pid": str(process.pid)}
            memory.add({**pid, "process": process.name, "container": short_id(process.container.id)},
                       optional(process, "used_memory_bytes"))
            if process.HasField("container") or process.HasField("pid_in_container"):
                placed.add({**pid, **_placement_labels(process)}, 1)


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


# How each latency figure is known (see LatencyStats in the proto).
_LATENCY_STATS = {
    "avg": "exact",
    "min": "exact when the slot's lifetime extreme fell in the interval, else a bucket-edge bound, within 1.6 %"
           " in the slot's fine window",
    "max": "exact when the slot's lifetime extreme fell in the interval, else a bucket-edge bound, within 1.6 %"
           " in the slot's fine window",
    "p50": "nearest-rank, estimated within 0.8 % in the slot's fine window, else within a factor of 1.5",
    "p99": "nearest-rank, estimated within 0.8 % in the slot's fine window, else within a factor of 1.5",
}


def _latency(out: Families, prefix: str, what: str, labels: Labels, latency: pb.LatencyStats) -> None:
    for stat, how in _LATENCY_STATS.items():
        out(f"{prefix}_latency_{stat}_seconds", "gauge",
            f"{stat} kernel time of one {what} over the interval ({how}).").add(
            labels, optional(latency, f"{stat}_seconds"))


def _rank_labels(host: Labels, pid: int, rank: pb.RankStats | pb.RankVerdict | pb.RankCost) -> Labels:
    """The labels every per-rank series has: pid, rank, local_rank ("" when unknown)."""
    local_rank = rank.local_rank if isinstance(rank, pb.RankStats) and rank.HasField("local_rank") else None
    return {**host, "pid": str(pid),
            "rank": str(rank.rank) if rank.HasField("rank") else "",
            "local_rank": "" if local_rank is None else str(local_rank)}


_HOOK_FLAGS = (
    ("cuda_timing", "1 when the hook resolved CUDA events, so GEMMs are timed."),
    ("nccl_plugin", "1 when NCCL loaded the hook as its profiler plugin."),
    ("nccl_gpu_timers", "1 when NCCL kernel-channel (GPU timer) events were seen."),
    ("nccl_api_fallback", "1 when NCCL did not take the profiler plugin and collectives are counted at its API."),
    ("nccl_api_events", "1 when those collectives are timed by CUDA events on their stream "
                        "(from their turn on the stream to their end; not kernel time)."),
)
_HOOK_COUNTERS = (
    ("gemm_untimed_total", "GEMMs counted but not timed (no CUDA event free, no CUDA)."),
    ("nccl_untimed_total", "Collectives finished without GPU timestamps."),
    ("dropped_records_total", "Records the hook lost because an internal queue was full."),
    ("slot_overflow_total", "Records folded into the overflow slot (too many op kinds)."),
    ("nccl_channel_shortfall_total", "Collectives finished with fewer kernel channels than announced."),
    ("nccl_late_channels_total", "Kernel-channel events for collectives already finished."),
    ("stale_inflight_total", "In-flight collectives left out: a later one of the same communicator finished."),
)


def _placement_labels(process: pb.GpuProcess | pb.RankStats) -> Labels:
    """Where a GPU process or a rank runs, as labels ("" for what is not known or does not apply)."""
    container = process.container
    return {"pid_in_container": str(process.pid_in_container) if process.HasField("pid_in_container") else "",
            "runtime": container.runtime, "container": short_id(container.id), "pod_uid": container.pod_uid,
            "pod_namespace": container.pod_namespace, "pod_name": container.pod_name,
            "slurm_job": container.slurm_job_id, "slurm_step": container.slurm_step}


def _rank_hook(out: Families, labels: Labels, hook: pb.HookHealth) -> None:
    """The hook library's own health (see the module docstring for the inert reason)."""
    out("rank_hook_active", "gauge", "1 when the hook library records in this rank, 0 when it stays inert.").add(
        labels, int(not hook.inactive_reason))
    if hook.inactive_reason:
        return
    for flag, help in _HOOK_FLAGS:
        out(f"rank_hook_{flag}", "gauge", help).add(labels, int(getattr(hook, flag)))
    for counter, help in _HOOK_COUNTERS:
        out(f"rank_hook_{counter}", "counter", help).add(labels, getattr(hook, counter))
    out("rank_hook_pending_ops", "gauge", "Operations launched and not yet finished, all streams.").add(
        labels, hook.pending)
    out("rank_hook_nccl_profiler_api", "gauge",
        "The NCCL profiler plugin API version NCCL took from the hook (1-6: NCCL 2.23-2.30; 0: none).").add(
        labels, hook.nccl_profiler_api)


def _rank_process_groups(out: Families, labels: Labels, rank: pb.RankStats) -> None:
    """PyTorch Flight Recorder progress per process group: compare ranks to find the one behind."""
    for group in rank.process_groups:
        g = {**labels, "process_group": group.id}
        out("rank_process_group_last_enqueued_sequence", "gauge",
            "Sequence number of the last collective this rank enqueued in the group (0: none yet).").add(
            g, group.last_enqueued)
        out("rank_process_group_last_completed_sequence", "gauge",
            "Sequence number of the last collective this rank completed in the group (0: none yet).").add(
            g, group.last_completed)


def _rank_functions(out: Families, labels: Labels, rank: pb.RankStats) -> None:
    """The rank's timed Python functions (``function``: a name from the job's own configuration, at most
    64 a rank and within the owner's ops budget)."""
    for timing in rank.functions:
        f = {**labels, "job_id": rank.job_id, "function": timing.name}
        out("rank_function_calls_total", "counter", "Calls of a named Python function that returned or raised.").add(
            f, timing.calls_total)
        out("rank_function_seconds_total", "counter",
            "Wall-clock time inside a named Python function (perf_counter).").add(f, timing.seconds_total)
        out("rank_function_max_seconds", "gauge", "The longest call of a named Python function so far.").add(
            f, timing.max_seconds)


_ALLOCATIONS = (("malloc", "cudaMalloc / cudaFree"), ("malloc_async", "cudaMallocAsync / cudaFreeAsync"))
_ALLOCATOR_GAUGES = (
    ("allocated_bytes", "Bytes PyTorch's CUDA caching allocator has allocated to tensors (current device)."),
    ("reserved_bytes", "Bytes PyTorch's CUDA caching allocator holds from the device (current device)."),
    ("peak_allocated_bytes", "The most bytes PyTorch's CUDA caching allocator had allocated at once."),
)
_ALLOCATOR_COUNTERS = (
    ("alloc_retries_total", "PyTorch caching allocator retries: a cudaMalloc failed, the cache was freed, retried."),
    ("ooms_total", "Out-of-memory errors PyTorch's CUDA caching allocator raised."),
)


def _rank_device_memory(out: Families, labels: Labels, memory: pb.DeviceMemoryStats) -> None:
    """The rank's CUDA allocations and copies (the hook library's counts) and PyTorch's allocator figures."""
    for api, calls in _ALLOCATIONS:
        a = {**labels, "api": api}
        stats = getattr(memory, api)
        out("rank_device_malloc_calls_total", "counter", f"Device allocations that succeeded ({calls}).").add(
            a, stats.malloc_calls_total)
        out("rank_device_malloc_bytes_total", "counter", "Bytes of those device allocations.").add(
            a, stats.malloc_bytes_total)
        out("rank_device_free_calls_total", "counter", "Device frees that succeeded (of NULL not counted).").add(
            a, stats.free_calls_total)
        out("rank_device_free_bytes_total", "counter",
            "Bytes of the device frees whose allocation the hook saw.").add(a, stats.free_bytes_total)
        out("rank_device_free_unknown_size_total", "counter",
            "Device frees of pointers the hook did not see allocated (their bytes are not counted).").add(
            a, stats.free_unknown_size_total)
    for copies in memory.copies:
        c = {**labels, "direction": copies.direction}
        out("rank_memcpy_calls_total", "counter", "CUDA copies (cudaMemcpy, cudaMemcpyAsync) by direction.").add(
            c, copies.calls_total)
        out("rank_memcpy_bytes_total", "counter", "Bytes of those CUDA copies.").add(c, copies.bytes_total)
        out("rank_memcpy_timed_calls_total", "counter",
            "CUDA copies timed with events on their stream (the first 32 a direction, then 1 in 16).").add(
            c, copies.timed_calls_total)
        out("rank_memcpy_seconds_total", "counter",
            "GPU time of all the copies, estimated from the timed ones (their mean times the copies).").add(
            c, optional(copies, "seconds_total"))
    for field, help in _ALLOCATOR_GAUGES:
        out(f"rank_torch_{field}", "gauge", help).add(labels, optional(memory, field))
    for field, help in _ALLOCATOR_COUNTERS:
        out(f"rank_torch_{field}", "counter", help).add(labels, optional(memory, field))


def _ranks(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """Per-rank families (from agentd.collectors.ranks), comparable to xpu-timer's."""
    for rank in snapshot.ranks:
        labels = _rank_labels(host, rank.pid, rank)
        out("rank_info", "gauge", "A rank's process (value 1); state: running, exited, stopped, zombie, disk-sleep.").add(
            {**labels, "job_id": rank.job_id, "state": rank_state(rank.state)}, 1)
        if rank.HasField("container") or rank.HasField("pid_in_container"):
            out("rank_container_info", "gauge",
                "Where a rank runs (value 1): its pid in its container, the container, pod and SLURM job.").add(
                {**labels, "job_id": rank.job_id, **_placement_labels(rank)}, 1)
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
        out("rank_run_delay_seconds_per_second", "gauge",
            "Time the rank's threads waited runnable for a CPU, summed over threads, per second.").add(
            labels, optional(rank, "run_delay_seconds_per_s"))
        out("rank_cpu_throttled_seconds_per_second", "gauge",
            "Time the rank's cgroup was throttled by its CPU quota, per second.").add(
            labels, optional(rank, "cpu_throttled_seconds_per_s"))
        if rank.HasField("pmu"):
            out("rank_pmu_hardware_available", "gauge",
                "1 when the rank's hardware PMU counters work, 0 when not (reason label says why).").add(
                {**labels, "reason": rank.pmu.hardware_reason}, int(rank.pmu.hardware_available))
            for name, field, scale, help in _PMU_GAUGES:
                out(f"rank_{name}", "gauge", f"{help} This rank's threads.").add(
                    labels, optional(rank.pmu, field, scale))
        if rank.HasField("hook"):
            _rank_hook(out, labels, rank.hook)
        _rank_process_groups(out, labels, rank)
        _rank_functions(out, labels, rank)
        if rank.HasField("device_memory"):
            _rank_device_memory(out, labels, rank.device_memory)
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
            out("rank_nccl_busbw_bytes_per_second", "gauge", "Bus bandwidth from NCCL kernel time (GPU timestamps, nccl-tests factors) over the interval; not call-to-call: below ~32 MiB a loop timed around the calls (nccl-tests) is lower.").add(
                c, optional(coll, "busbw_bytes_per_s"))
            _latency(out, "rank_nccl", "collective", c, coll.latency)


def _rank_segments(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """Rank segment files the ranks collector refused, per reason: someone planting files shows here."""
    refused = out("rank_segments_refused", "gauge",
                  "Files under rank segment names refused in the latest interval (their claims fail the "
                  "kernel's checks), per reason code.")
    for entry in snapshot.rank_segments_refused:
        if entry.reason in rank_claims.REASONS:  # a fixed set: a label value never comes from the files
            refused.add({**host, "reason": entry.reason}, entry.files)


def _rank_ops_dropped(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """Ops of an owner's ranks left out past the per-owner budget: one series per owner over it."""
    dropped = out("rank_ops_dropped", "gauge",
                  "Ops (GEMM and NCCL aggregates, in-flight entries, process groups) of this owner's ranks left "
                  "out of the latest interval: more than the agent's per-owner budget (the snapshot's "
                  "rank_ops_dropped says why).")
    for entry in snapshot.rank_ops_dropped:
        dropped.add({**host, "uid": str(entry.uid)}, entry.ops)


HANG_LEVELS = (pb.HANG_LEVEL_OK, pb.HANG_LEVEL_SUSPECT, pb.HANG_LEVEL_HUNG)
RANK_HANG_LEVELS = (*HANG_LEVELS, pb.HANG_LEVEL_EXITED)


def _hang(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """The hang detector's verdicts, one series per level (1 for the current one); none when detection is off."""
    hang = snapshot.hang
    if hang.level == pb.HANG_LEVEL_UNSPECIFIED:
        return
    status = out("hang_status", "gauge", "1 for the host's current hang level (ok, suspect, hung), 0 for the others.")
    for level in HANG_LEVELS:
        status.add({**host, "level": hang_level(level)}, int(hang.level == level))
    if hang.since_unix_ns:
        out("hang_since_timestamp_seconds", "gauge", "When the host entered its current hang level (Unix time).").add(
            host, hang.since_unix_ns / 1e9)
    ranks = {rank.pid: rank for rank in snapshot.ranks}
    per_rank = out("rank_hang_status", "gauge",
                   "1 for the rank's current hang level (ok, suspect, hung, exited), 0 for the others.")
    for verdict in hang.ranks:
        labels = _rank_labels(host, verdict.pid, ranks.get(verdict.pid, verdict))
        for level in RANK_HANG_LEVELS:
            per_rank.add({**labels, "level": hang_level(level)}, int(verdict.level == level))


def _slowdowns(out: Families, snapshot: pb.HostSnapshot, info: pb.AgentInfo, host: Labels) -> None:
    """The slowdown verdict of each job with ranks here: every rank's cost, and the job's state and cause."""
    ranks = {rank.pid: rank for rank in snapshot.ranks}
    for job in snapshot.slowdowns:
        out("job_slow", "gauge", "1 while the job is judged slow (cause: the verdict's cause), 0 while healthy.").add(
            {**host, "job_id": job.job_id, "cause": slowdown_cause(job.cause)}, int(job.slow))
        for cost in job.ranks:
            out("rank_slowdown_cost_seconds", "gauge",
                "Time per step the rank's peers waited for it at collectives over the verdict's window: how much "
                "shorter the step would be had it arrived with them.").add(
                {**_rank_labels(host, cost.pid, ranks.get(cost.pid, cost)), "job_id": job.job_id}, cost.cost_seconds)


def _collector_runs(out: Families, runs: Mapping[str, CollectRun], host: Labels) -> None:
    duration = out("collector_duration_seconds", "gauge", "Wall time of the collector's latest collect().")
    success = out("collector_success", "gauge", "1 when the collector's latest collect() succeeded, 0 when it failed.")
    cpu = out("collector_cpu_seconds_total", "counter",
              "CPU time (user + system) of the collector's collect() calls since the agent started.")
    for name, run in runs.items():
        duration.add({**host, "collector": name}, run.duration_seconds)
        success.add({**host, "collector": name}, int(run.success))
        cpu.add({**host, "collector": name}, run.cpu_seconds_total)


Section = Callable[[Families, pb.HostSnapshot, pb.AgentInfo, Labels], None]

# One renderer per part of the snapshot; per-rank families (GEMM, NCCL) get their own.
SECTIONS: tuple[Section, ...] = (_agent, _cpu, _memory, _network, _rdma, _disks, _gpus, _pmu, _ranks, _rank_segments,
                                  _rank_ops_dropped, _hang, _slowdowns)


def render_metrics(snapshot: pb.HostSnapshot, info: pb.AgentInfo,
                   runs: Mapping[str, CollectRun] | None = None) -> str:
    """The exposition text for one snapshot (``info`` supplies versions, ``runs`` the collectors' timings)."""
    out = Families()
    host = {"hostname": snapshot.hostname or info.hostname}
    for section in SECTIONS:
        section(out, snapshot, info, host)
    _collector_runs(out, runs or {}, host)
    return out.render()


# dynolog's Prometheus families (all gauges) and what each holds, as its exporter registers them.
DYNOLOG_HOST_GAUGES = {
    "cpu_util": "Percent of all CPUs' time not idle over the last interval.",
    "cpu_u": "Percent of all CPUs' time in user mode over the last interval.",
    "cpu_s": "Percent of all CPUs' time in system mode over the last interval.",
    "cpu_i": "Percent of all CPUs' time idle over the last interval.",
    "mips": "Millions of instructions retired per second over the last interval.",
    "mega_cycles_per_second": "Millions of unhalted CPU cycles per second over the last interval.",
    "uptime": "Seconds since the host booted.",
    **{f"cpu_{letter}_ms": f"Milliseconds of all CPUs' time in {mode} mode during the last interval (/proc/stat)."
       for letter, mode in (("u", "user"), ("s", "system"), ("n", "nice"), ("w", "iowait"), ("x", "irq"),
                            ("y", "softirq"))},
}
DYNOLOG_NIC_GAUGES = {
    f"{direction}_{what}": f"{noun} {verb} on the interface during the last interval."
    for direction, verb in (("rx", "received"), ("tx", "sent"))
    for what, noun in (("bytes", "Bytes"), ("packets", "Packets"), ("errors", "Errors"), ("drops", "Packets dropped"))
}


def render_dynolog_metrics(snapshot: pb.HostSnapshot, previous: pb.HostSnapshot | None) -> str:
    """dynolog's exposition for ``snapshot``: deltas (cpu_*_ms, NIC counts) need ``previous``, the one before."""
    record = dynolog_record(snapshot, previous)
    out = Families(prefix="")
    host = {"host_name": snapshot.hostname}
    for name, help in DYNOLOG_HOST_GAUGES.items():
        out(name, "gauge", help).add(host, record.get(name))
    for name, help in DYNOLOG_NIC_GAUGES.items():
        family = out(name, "gauge", help)
        for nic in snapshot.nics:
            family.add({**host, "net": nic.name}, record.get(f"{name}.{nic.name}"))
    return out.render()
