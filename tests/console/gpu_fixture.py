"""FIXTURE, not a measurement: plausible GPU-host snapshots built from the proto.

This machine has no GPU, so the GPU-bearing test recording is synthesized here
with realistic values (8 × H100 80GB per host, 8 ranks, GEMM and NCCL ops) and a
few planted conditions to look at: one host with a straggler rank (slow
AllReduce), one host whose GPUs sit idle and whose ranks are hung, and one host
that goes unreachable. The CPU-only recording in data/agents-2hosts.ndjson is
the real one (two real agentd). Regenerate with:

    .venv/bin/python tests/console/gpu_fixture.py tests/console/data/gpu-fixture-4hosts.ndjson
"""

from __future__ import annotations

import random
import sys
import zlib

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model import record
from tuiprof.model.events import HostUnreachable, InfoReceived, SnapshotReceived

GPUS = 8
RANKS = 8
H100_MEMORY = 80 * 2**30
START_UNIX = 1_795_000_000.0


def gpu_info(hostname: str) -> pb.AgentInfo:
    info = pb.AgentInfo(
        hostname=hostname, agent_version="0.1.0", python_version="3.11.7",
        kernel_release="6.8.0-fixture", cpu_count=96, memory_total_bytes=2 * 2**40,
        interval_seconds=1.0, driver_version="580.65.06", nvml_version="13.580.65.06",
        cuda_driver_version="13.0",
    )
    for index in range(GPUS):
        info.gpus.add(index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{hostname}-{index}",
                      pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", memory_total_bytes=H100_MEMORY,
                      architecture="Hopper", gpm_supported=True)
    for name in ("host", "gpu", "pmu", "ranks", "hang"):
        info.collectors.add(name=name, available=True, interval_seconds=1.0)
    return info


def gpu_snapshot(hostname: str, host_index: int, sequence: int, *, idle: bool = False,
                 slow_rank: int | None = None) -> pb.HostSnapshot:
    rng = random.Random(zlib.crc32(f"{hostname}/{sequence}".encode()))
    snap = pb.HostSnapshot(hostname=hostname, sequence=sequence,
                           timestamp_unix_ns=int((START_UNIX + sequence) * 1e9))
    for name in ("host", "gpu", "pmu", "ranks", "hang"):
        snap.collectors.add(name=name, available=True, interval_seconds=1.0)
    busy = 2.0 if idle else 38.0
    cpu = snap.cpu
    cpu.user_percent, cpu.system_percent = busy * 0.8 + rng.random(), busy * 0.2
    cpu.idle_percent, cpu.iowait_percent = 100 - busy - 0.4, 0.4
    cpu.load1, cpu.load5, cpu.load15, cpu.process_count = busy / 2.5, busy / 2.6, busy / 2.7, 812
    for core in range(8):
        c = cpu.cores.add(cpu=core, user_percent=busy + rng.uniform(-5, 5), system_percent=6.0,
                          iowait_percent=0.2)
        c.idle_percent = max(0.0, 100 - c.user_percent - c.system_percent - c.iowait_percent)
    mem = snap.memory
    mem.total_bytes, mem.used_bytes = 2 * 2**40, int(0.41 * 2 * 2**40)
    mem.available_bytes, mem.swap_total_bytes, mem.swap_used_bytes = int(0.57 * 2 * 2**40), 0, 0
    nic = snap.nics.add(name="ib0", rx_bytes_per_s=0.0 if idle else 21.4e9 + rng.uniform(-1e9, 1e9),
                        tx_bytes_per_s=0.0 if idle else 21.1e9 + rng.uniform(-1e9, 1e9),
                        rx_bytes_total=10**15, tx_bytes_total=10**15, rx_errors_total=0, tx_errors_total=0,
                        rx_drops_total=0, tx_drops_total=0)
    del nic
    snap.disks.add(name="nvme0n1", read_bytes_per_s=310e6, write_bytes_per_s=42e6, read_iops=2400,
                   write_iops=180, read_bytes_total=10**13, write_bytes_total=10**12,
                   busy_seconds_total=5000.0, busy_percent=7.5, reads_total=10**8, writes_total=10**7)
    for index in range(GPUS):
        util = rng.uniform(0, 3) if idle else rng.uniform(92, 100)
        gpu = snap.gpus.add(index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{hostname}-{index}",
                            pci_bus_id=f"00000000:{0x18 + index:02X}:00.0")
        gpu.utilization_percent = util
        gpu.memory_utilization_percent = util * 0.4
        gpu.memory_used_bytes = int(71.3 * 2**30) if not idle else int(64.0 * 2**30)
        gpu.memory_total_bytes = H100_MEMORY
        gpu.power_watts = 95.0 + rng.uniform(0, 5) if idle else 540 + rng.uniform(0, 150)
        gpu.power_limit_watts = 700.0
        gpu.temperature_celsius = 34 + rng.uniform(0, 2) if idle else 61 + rng.uniform(0, 9)
        gpu.sm_clock_hz, gpu.memory_clock_hz = 1.98e9, 2.619e9
        gpu.clock_event_reasons_mask = 0 if idle else 4
        if not idle:
            gpu.clock_event_reasons.append("sw_power_cap")
        gpu.ecc_corrected_total = gpu.ecc_uncorrected_total = 0
        gpu.nvlink_rx_bytes_per_s = 0.0 if idle else 118e9 + rng.uniform(-5e9, 5e9)
        gpu.nvlink_tx_bytes_per_s = 0.0 if idle else 118e9 + rng.uniform(-5e9, 5e9)
        gpu.unavailable["pcie_rx_bytes_per_s"] = "kept off the hot path; sampled every 10 s"
        gpu.unavailable["pcie_tx_bytes_per_s"] = "kept off the hot path; sampled every 10 s"
        gpu.sm_active_percent = util * 0.01 if idle else util * 0.78
        gpu.sm_occupancy_percent = 0.5 if idle else util * 0.41
        gpu.tensor_active_percent = 0.0 if idle else util * 0.47
        gpu.dram_active_percent = 0.1 if idle else util * 0.33
        gpu.gpm_window_seconds = 1.0
        gpu.processes.add(pid=41000 + index, name="python", used_memory_bytes=gpu.memory_used_bytes,
                          cpu_percent=0.5 if idle else 101.0 + index, resident_memory_bytes=(9 << 30) + index * (1 << 27),
                          start_time_unix_seconds=START_UNIX - 3 * 3600 - 125)
    pmu = snap.pmu
    pmu.scope, pmu.hardware_available = "system", True
    pmu.mips, pmu.mega_cycles_per_s, pmu.ipc = 91000.0, 120000.0, 0.76
    pmu.cache_misses_per_s, pmu.cache_miss_percent, pmu.branch_misses_per_s = 4.1e8, 9.6, 3.3e8
    pmu.task_clock_cpus, pmu.context_switches_per_s = 36.0, 52000.0
    pmu.page_faults_per_s, pmu.cpu_migrations_per_s = 1200.0, 310.0
    for local in range(RANKS):
        global_rank = host_index * RANKS + local
        rank = snap.ranks.add(pid=41000 + local, rank=global_rank, local_rank=local,
                              world_size=32, job_id="4242", state=pb.RANK_STATE_RUNNING,
                              heartbeat_age_seconds=0.2, step_count=1200 + sequence)
        slow = 1.0 if slow_rank != global_rank else 2.7
        if idle:
            rank.step_time_seconds = 61.0 + sequence
            rank.unavailable["gemm_tflops"] = "no GEMM finished in this interval"
            rank.inflight.add(kind="nccl", op="AllReduce", comm_hash="9f3c1a", sequence=88120,
                              age_seconds=61.0 + sequence, stream=7)
        else:
            rank.step_time_seconds = 0.412 * (1.25 if slow > 1 else 1.0) + rng.uniform(0, 0.004)
            rank.gemm_tflops = 612.0 + rng.uniform(-12, 12)
        gemm = rank.gemm.add(op="cublasLtMatmul", dtype="bf16", shape="b=1 m=8192 n=8192 k=8192",
                             count_total=180000 + 200 * sequence, count_per_s=0.0 if idle else 206.0,
                             flops_total=1.1e17)
        gemm.latency.avg_seconds = 1.81e-3 + rng.uniform(0, 2e-5)
        gemm.latency.p50_seconds = 1.80e-3 + rng.uniform(0, 2e-5)
        gemm.latency.p99_seconds = 1.93e-3 + rng.uniform(0, 2e-5)
        gemm.latency.min_seconds, gemm.latency.max_seconds = 1.71e-3, 2.2e-3 + rng.uniform(0, 1e-4)
        if not idle:
            gemm.tflops = 607.0 + rng.uniform(-8, 8)
        nccl = rank.nccl.add(op="AllReduce", dtype="bf16", algorithm="Ring", protocol="Simple",
                             comm_hash="9f3c1a", comm_size=32, count_total=88000 + sequence,
                             count_per_s=0.0 if idle else 24.0, bytes_total=10**14)
        nccl.latency.avg_seconds = 4.9e-3 * slow + rng.uniform(0, 5e-5)
        nccl.latency.p50_seconds = 4.8e-3 * slow + rng.uniform(0, 5e-5)
        nccl.latency.p99_seconds = 6.1e-3 * slow + rng.uniform(0, 5e-5)
        nccl.latency.min_seconds, nccl.latency.max_seconds = 4.1e-3 * slow, 7.9e-3 * slow
        if not idle:
            nccl.algbw_bytes_per_s = 98e9 / slow
            nccl.busbw_bytes_per_s = 98e9 * 2 * 31 / 32 / slow
        rank.pmu.scope = "process"
        rank.pmu.hardware_available = True
        rank.pmu.ipc = 0.81
        hook = rank.hook
        hook.cuda_timing = hook.nccl_plugin = hook.nccl_gpu_timers = True
        hook.pending = 1 if idle else 0
        if host_index == 0 and local == 0:  # planted: a ring that overflowed once
            hook.dropped_records_total = 37
        enqueued = 88120 if idle else 88000 + sequence
        rank.process_groups.add(id="0", last_enqueued=enqueued, last_completed=enqueued - 1 if idle else enqueued)
    hang = snap.hang
    if idle:
        hang.level, hang.since_unix_ns = "hung", int((START_UNIX - 60) * 1e9)
        hang.explanation = "AllReduce #88120 on comm 9f3c1a in flight for 61 s on every local rank"
    else:
        hang.level = pb.HANG_LEVEL_OK
    return snap


def events(seconds: int = 4, down_at: int = 3) -> list:
    """``seconds`` of snapshots from 4 hosts; gpu-node-04 goes unreachable at ``down_at``."""
    hosts = [f"gpu-node-{i:02d}" for i in range(1, 5)]
    out: list = []
    for index, host in enumerate(hosts):
        out.append(InfoReceived(host, START_UNIX - 1 + index * 0.01, gpu_info(host)))
    for second in range(seconds):
        for index, host in enumerate(hosts):
            at = START_UNIX + second + index * 0.01
            if host == "gpu-node-04" and second >= down_at:
                if second == down_at:
                    out.append(HostUnreachable(host, at, "cannot connect: failed to connect to all "
                                               "addresses; last error: Connection refused"))
                continue
            message = gpu_snapshot(host, index, second, idle=host == "gpu-node-03",
                                   slow_rank=13 if host == "gpu-node-02" else None)
            out.append(SnapshotReceived(host, at, message))
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as handle:
        for event in events():
            handle.write(record.encode(event) + "\n")
