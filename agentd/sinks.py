"""The JSON-lines sink: one JSON object per snapshot, with dynolog's metric names.

dynolog's JSON logger prints ``time = ... data = {...}`` with floats as strings;
here every line is a complete JSON object with real numbers, so ``jq`` and log
shippers read it directly. Names follow dynolog where it has one:

- CPU percent 0-100: ``cpu_u``, ``cpu_s``, ``cpu_i``, ``cpu_w`` (iowait), ``cpu_util``,
  ``cpu_guest``, ``cpu_guest_nice``; ``uptime`` in seconds.
- CPU time per mode over ``interval_s`` in ms, all CPUs: ``cpu_u_ms`` (user), ``cpu_s_ms``
  (system), ``cpu_n_ms`` (nice), ``cpu_w_ms`` (iowait), ``cpu_x_ms`` (irq), ``cpu_y_ms``
  (softirq), ``cpu_z_ms`` (steal), ``cpu_guest_ms``, ``cpu_guest_nice_ms``.
- Per NUMA node, percent 0-100 over the interval: ``cpu_u_node<N>``, ``cpu_s_node<N>``,
  ``cpu_i_node<N>`` (dynolog writes them only on hosts with more than one socket; here for every node).
- Per NIC, deltas over ``interval_s`` like dynolog's: ``rx_bytes.<nic>``,
  ``tx_bytes.<nic>``, ``rx_packets.<nic>``, ``tx_packets.<nic>``, ``rx_errors.<nic>``,
  ``tx_errors.<nic>``, ``rx_drops.<nic>``, ``tx_drops.<nic>``.
- Per RDMA port, deltas over ``interval_s`` named as dynolog's RDMA monitor names them:
  ``<netdev>.<counter>`` (the device name where sysfs names no netdev) for every file of the
  port's ``counters/`` and ``hw_counters/``, e.g. ``ib0.port_rcv_errors``, ``ib0.np_cnp_sent``;
  and per NIC its driver's pause-frame counters, ``<nic>.tx_prio3_pause`` ...
- PMU: ``mips``, ``mega_cycles_per_second`` (per-interval rates, where dynolog's are since start).
- Per GPU, suffix ``.<index>``, DCGM-field names as dynolog logs them:
  ``gpu_frequency_mhz``, ``gpu_power_draw``, ``gpu_device_utilization``,
  ``gpu_memory_utilization``, ``sm_active_ratio``, ``graphics_engine_active_ratio`` ... (ratios 0-1),
  ``pcie_tx_bytes``/``nvlink_rx_bytes`` ... (bytes per second, as DCGM reports them), ``minor_id``,
  ``dcgm_error`` (1 when an NVML query of the sample failed with an error that may pass, as
  dynolog's is 1 when a DCGM field came back blank; 0 for a complete sample).
- Beyond dynolog: ``cpu_n``/``cpu_x``/``cpu_y``/``cpu_z`` percent (nice, irq, softirq, steal),
  ``interrupts``/``softirqs`` deltas, ``load1/5/15``, ``processes``, ``mem_*``/``swap_*`` bytes, per disk
  ``read_bytes.<disk>``/``write_bytes.<disk>`` deltas and ``read_iops.<disk>``/``write_iops.<disk>``.

A value that could not be read is left out (never written as 0); the
``unavailable`` object names each collector that could not run, with why.

A sink file is rotated by size: past ``ROTATE_BYTES`` it becomes ``FILE.1``
(replacing the previous one) and a new ``FILE`` is started, so an agent that runs
for months keeps at most about twice that on disk. stdout is never rotated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterable
from typing import IO, Any

from agentd.agent import Agent
from agentd.errors import ConfigError
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

# Size past which a --json-sink file is rotated (one line is ~1-10 KiB: days of 1 s snapshots).
ROTATE_BYTES = 64 * 1024 * 1024

# (proto field, sink name, scale): floats are multiplied by scale; scale None copies
# the value as it is (integers stay integers).
_CPU = (("user_percent", "cpu_u", 1.0), ("system_percent", "cpu_s", 1.0),
        ("idle_percent", "cpu_i", 1.0), ("iowait_percent", "cpu_w", 1.0),
        ("load1", "load1", 1.0), ("load5", "load5", 1.0), ("load15", "load15", 1.0),
        ("process_count", "processes", None), ("uptime_seconds", "uptime", 1.0),
        ("guest_percent", "cpu_guest", 1.0), ("guest_nice_percent", "cpu_guest_nice", 1.0),
        ("nice_percent", "cpu_n", 1.0), ("irq_percent", "cpu_x", 1.0),
        ("softirq_percent", "cpu_y", 1.0), ("steal_percent", "cpu_z", 1.0))
# (CpuModeSeconds field, dynolog's name of its delta in milliseconds)
_CPU_MS = (("user", "cpu_u_ms"), ("system", "cpu_s_ms"), ("nice", "cpu_n_ms"), ("iowait", "cpu_w_ms"),
           ("irq", "cpu_x_ms"), ("softirq", "cpu_y_ms"), ("steal", "cpu_z_ms"),
           ("guest", "cpu_guest_ms"), ("guest_nice", "cpu_guest_nice_ms"))
_CPU_COUNTS = (("interrupts_total", "interrupts"), ("softirqs_total", "softirqs"))
_MEMORY = (("total_bytes", "mem_total", None), ("used_bytes", "mem_used", None),
           ("available_bytes", "mem_available", None), ("swap_total_bytes", "swap_total", None),
           ("swap_used_bytes", "swap_used", None))
_PMU = (("mips", "mips", 1.0), ("mega_cycles_per_s", "mega_cycles_per_second", 1.0),
        ("ipc", "ipc", 1.0), ("cache_misses_per_s", "cache_misses_per_s", 1.0),
        ("branch_misses_per_s", "branch_misses_per_s", 1.0),
        ("context_switches_per_s", "context_switches_per_s", 1.0))
_GPU = (("utilization_percent", "gpu_device_utilization", 1.0),
        ("memory_utilization_percent", "gpu_memory_utilization", 1.0),
        ("sm_clock_hz", "gpu_frequency_mhz", 1e-6), ("power_watts", "gpu_power_draw", 1.0),
        ("temperature_celsius", "gpu_temperature", 1.0),
        ("memory_used_bytes", "gpu_memory_used", None), ("memory_total_bytes", "gpu_memory_total", None),
        ("sm_active_percent", "sm_active_ratio", 0.01), ("sm_occupancy_percent", "sm_occupancy", 0.01),
        ("tensor_active_percent", "tensorcore_active", 0.01),
        ("dram_active_percent", "hbm_mem_bw_util", 0.01),
        ("fp16_active_percent", "fp16_active", 0.01), ("fp32_active_percent", "fp32_active", 0.01),
        ("fp64_active_percent", "fp64_active", 0.01),
        ("graphics_active_percent", "graphics_engine_active_ratio", 0.01),
        ("pcie_tx_bytes_per_s", "pcie_tx_bytes", 1.0), ("pcie_rx_bytes_per_s", "pcie_rx_bytes", 1.0),
        ("nvlink_tx_bytes_per_s", "nvlink_tx_bytes", 1.0),
        ("nvlink_rx_bytes_per_s", "nvlink_rx_bytes", 1.0), ("minor_number", "minor_id", None))
_NUMA_NODE = (("user_percent", "cpu_u", 1.0), ("system_percent", "cpu_s", 1.0), ("idle_percent", "cpu_i", 1.0))
_NIC_TOTALS = (("rx_bytes_total", "rx_bytes"), ("tx_bytes_total", "tx_bytes"),
               ("rx_packets_total", "rx_packets"), ("tx_packets_total", "tx_packets"),
               ("rx_errors_total", "rx_errors"), ("tx_errors_total", "tx_errors"),
               ("rx_drops_total", "rx_drops"), ("tx_drops_total", "tx_drops"))
_DISK_TOTALS = (("read_bytes_total", "read_bytes"), ("write_bytes_total", "write_bytes"))
_DISK_RATES = (("read_iops", "read_iops", 1.0), ("write_iops", "write_iops", 1.0))


def _copy(record: dict[str, Any], message: Any, fields: Iterable[tuple[str, str, float | None]],
          suffix: str = "") -> None:
    """Copy the fields ``message`` has; unset (unavailable) fields stay out of the record."""
    for field, name, scale in fields:
        if message.HasField(field):
            value = getattr(message, field)
            record[name + suffix] = value if scale is None else value * scale


def _deltas(record: dict[str, Any], current: Iterable[Any], previous: Iterable[Any],
            fields: Iterable[tuple[str, str]]) -> None:
    """Counter increases since the previous record, for devices present in both."""
    before = {item.name: item for item in previous}
    for item in current:
        old = before.get(item.name)
        if old is None:
            continue
        for field, name in fields:
            if item.HasField(field) and old.HasField(field):
                increase = getattr(item, field) - getattr(old, field)
                if increase >= 0:  # a counter reset gives no delta, not a negative one
                    record[f"{name}.{item.name}"] = increase


def _cpu_deltas(record: dict[str, Any], current: pb.CpuStats, previous: pb.CpuStats) -> None:
    """CPU time per mode (ms) and interrupt counts since the previous record; none after a reset."""
    if current.HasField("seconds_total") and previous.HasField("seconds_total"):
        for mode, name in _CPU_MS:
            increase = getattr(current.seconds_total, mode) - getattr(previous.seconds_total, mode)
            if increase >= 0:
                record[name] = round(increase * 1000.0, 3)
    for field, name in _CPU_COUNTS:
        if current.HasField(field) and previous.HasField(field) and getattr(current, field) >= getattr(previous, field):
            record[name] = getattr(current, field) - getattr(previous, field)


def _numa_nodes(record: dict[str, Any], cpu: pb.CpuStats) -> None:
    for node in cpu.numa_nodes:
        _copy(record, node, _NUMA_NODE, f"_node{node.node}")


def _driver_counters(snapshot: pb.HostSnapshot) -> dict[str, int]:
    """RDMA port and NIC pause counters under dynolog's ``<interface>.<counter>`` keys."""
    counters = {f"{nic.name}.{c.name}": c.value for nic in snapshot.nics for c in nic.ethtool_stats}
    for port in snapshot.rdma.ports:
        for counter in (*port.counters, *port.hw_counters):
            if counter.HasField("value"):  # an unreadable counter has no delta
                counters[f"{port.netdev or port.device}.{counter.name}"] = counter.value
    return counters


def _driver_counter_deltas(record: dict[str, Any], current: pb.HostSnapshot, previous: pb.HostSnapshot) -> None:
    """Driver counter increases since the previous record, for counters present in both."""
    before = _driver_counters(previous)
    for key, value in _driver_counters(current).items():
        old = before.get(key)
        if old is not None and value >= old:
            record[key] = value - old


def _gpu(record: dict[str, Any], gpu: pb.GpuStats) -> None:
    suffix = f".{gpu.index}"
    record["gpu_name" + suffix] = gpu.name
    record["gpu_uuid" + suffix] = gpu.uuid
    _copy(record, gpu, _GPU, suffix)
    if gpu.HasField("nvml_failed_queries"):
        record["dcgm_error" + suffix] = int(gpu.nvml_failed_queries > 0)


def dynolog_record(snapshot: pb.HostSnapshot, previous: pb.HostSnapshot | None) -> dict[str, Any]:
    """One sink line for ``snapshot``; counter deltas need the ``previous`` line's snapshot."""
    record: dict[str, Any] = {
        "time_unix_ns": snapshot.timestamp_unix_ns,
        "hostname": snapshot.hostname,
        "sequence": snapshot.sequence,
    }
    if snapshot.HasField("cpu"):
        _copy(record, snapshot.cpu, _CPU)
        if snapshot.cpu.HasField("idle_percent"):
            record["cpu_util"] = 100.0 - snapshot.cpu.idle_percent
        _numa_nodes(record, snapshot.cpu)
    if snapshot.HasField("memory"):
        _copy(record, snapshot.memory, _MEMORY)
    if snapshot.HasField("pmu"):
        _copy(record, snapshot.pmu, _PMU)
    for disk in snapshot.disks:
        _copy(record, disk, _DISK_RATES, f".{disk.name}")
    if previous is not None:
        record["interval_s"] = (snapshot.timestamp_unix_ns - previous.timestamp_unix_ns) / 1e9
        _cpu_deltas(record, snapshot.cpu, previous.cpu)
        _deltas(record, snapshot.nics, previous.nics, _NIC_TOTALS)
        _deltas(record, snapshot.disks, previous.disks, _DISK_TOTALS)
        _driver_counter_deltas(record, snapshot, previous)
    for gpu in snapshot.gpus:
        _gpu(record, gpu)
    unavailable = {s.name: s.reason for s in snapshot.collectors if not s.available}
    if unavailable:
        record["unavailable"] = unavailable
    return record


def _append(path: str) -> IO[str]:
    return open(path, "a", encoding="utf-8", buffering=1)


class JsonLinesSink:
    """Writes one line per snapshot to a stream; a slow stream skips snapshots, never stalls."""

    def __init__(self, stream: IO[str], path: str | None) -> None:
        """``path`` is the file ``stream`` appends to (rotated by size); None for stdout."""
        self._stream = stream
        self._path = path
        self._size = os.fstat(stream.fileno()).st_size if path is not None else 0
        self._previous: pb.HostSnapshot | None = None

    @classmethod
    def open(cls, target: str) -> JsonLinesSink:
        """``-`` for stdout, otherwise a file opened for appending."""
        if target == "-":
            return cls(sys.stdout, path=None)
        try:
            return cls(_append(target), path=target)
        except OSError as exc:
            raise ConfigError(
                f"cannot open --json-sink file {target}: {exc.strerror}; "
                "fix the path or permissions, or use - for stdout"
            ) from None

    def write(self, snapshot: pb.HostSnapshot) -> None:
        line = json.dumps(dynolog_record(snapshot, self._previous), separators=(",", ":")) + "\n"
        self._stream.write(line)
        self._stream.flush()
        self._previous = snapshot
        self._size += len(line.encode())
        if self._path is not None and self._size > ROTATE_BYTES:
            self._rotate(self._path)

    def _rotate(self, path: str) -> None:
        """Move the full file to ``path.1`` (replacing the older one) and start an empty one."""
        self._stream.close()
        os.replace(path, path + ".1")
        self._stream = _append(path)
        self._size = 0
        log.info("JSON sink rotated", extra={"path": path, "previous": path + ".1"})

    async def run(self, agent: Agent) -> None:
        """Write every snapshot the agent publishes until cancelled (writes off the loop)."""
        slot = agent.subscribe()
        try:
            while True:
                snapshot = await slot.take()
                try:
                    await asyncio.to_thread(self.write, snapshot)
                except OSError:
                    log.exception("JSON sink write failed; sink stopped")
                    return
        finally:
            agent.unsubscribe(slot)

    def close(self) -> None:
        if self._path is not None:
            self._stream.close()
