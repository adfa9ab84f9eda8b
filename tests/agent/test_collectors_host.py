"""HostCollector against the machine it runs on: psutil's counters, real traffic, real disk writes."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from agentd.collectors.host import CpuTimes, HostCollector, cpu_shares
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb


def snapshot_of(collector: HostCollector) -> pb.HostSnapshot:
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return snapshot


def nic(snapshot: pb.HostSnapshot, name: str) -> pb.NicStats:
    return next(n for n in snapshot.nics if n.name == name)


def test_nothing_is_filled_before_the_first_sample() -> None:
    snapshot = snapshot_of(HostCollector(1.0))
    assert not snapshot.HasField("cpu") and not snapshot.nics and not snapshot.disks


def test_first_sample_has_totals_and_says_rates_are_unavailable() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    snapshot = snapshot_of(collector)
    cpu = snapshot.cpu
    assert not cpu.HasField("user_percent")
    assert dict(cpu.unavailable) == {f: FIRST_SAMPLE for f in ("user_percent", "system_percent", "idle_percent", "iowait_percent")}
    assert len(cpu.cores) == psutil.cpu_count()
    assert all(core.unavailable["idle_percent"] == FIRST_SAMPLE for core in cpu.cores)
    assert cpu.load1 == pytest.approx(os.getloadavg()[0], abs=0.5)
    assert cpu.process_count == pytest.approx(len(psutil.pids()), abs=20)
    assert snapshot.memory.total_bytes == psutil.virtual_memory().total
    assert snapshot.memory.swap_total_bytes == psutil.swap_memory().total
    loopback = nic(snapshot, "lo")
    assert not loopback.HasField("rx_bytes_per_s")
    assert loopback.unavailable["rx_bytes_per_s"] == FIRST_SAMPLE
    assert loopback.rx_bytes_total <= psutil.net_io_counters(pernic=True)["lo"].bytes_recv


def test_cpu_shares_follow_a_busy_child_process() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    started = time.monotonic()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])
    _, _, usage = os.wait4(busy.pid, 0)  # this child's own CPU time, from the kernel
    busy.returncode = 0
    collector.collect()
    elapsed = time.monotonic() - started
    cpu = snapshot_of(collector).cpu
    shares = cpu.user_percent + cpu.system_percent + cpu.idle_percent + cpu.iowait_percent
    assert shares <= 100.0 + 1e-6
    # the host was at least as busy as this one child kept it
    child_share = 100.0 * (usage.ru_utime + usage.ru_stime) / (elapsed * psutil.cpu_count())
    assert 100.0 - cpu.idle_percent >= child_share * 0.8
    assert all(0.0 <= core.idle_percent <= 100.0 for core in cpu.cores)


def test_loopback_traffic_shows_up_as_bytes_per_second() -> None:
    payload = b"x" * (1 << 20)
    rounds = 16
    server = socket.create_server(("127.0.0.1", 0))
    received = []

    def drain() -> None:
        connection, _ = server.accept()
        with connection:
            while chunk := connection.recv(1 << 16):
                received.append(len(chunk))

    reader = threading.Thread(target=drain)
    reader.start()
    collector = HostCollector(1.0)
    collector.collect()
    before = nic(snapshot_of(collector), "lo")
    started = time.monotonic()
    with socket.create_connection(server.getsockname()) as client:
        for _ in range(rounds):
            client.sendall(payload)
    reader.join(timeout=30)
    server.close()
    time.sleep(0.05)
    collector.collect()
    elapsed = time.monotonic() - started
    loopback = nic(snapshot_of(collector), "lo")
    assert sum(received) == rounds * len(payload)
    assert loopback.rx_bytes_total - before.rx_bytes_total >= rounds * len(payload)
    # everything sent was received on lo within the interval (plus TCP headers and other traffic)
    assert loopback.rx_bytes_per_s * elapsed >= rounds * len(payload) * 0.95
    assert loopback.tx_bytes_per_s == pytest.approx(loopback.rx_bytes_per_s, rel=0.01)


def _whole_disk_of(path: pathlib.Path) -> str | None:
    """The whole-disk block device behind ``path`` (None for tmpfs/overlay without one)."""
    device = os.stat(path).st_dev
    sys_path = pathlib.Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    if not sys_path.exists():
        return None
    resolved = sys_path.resolve()
    if (resolved / "partition").exists():
        resolved = resolved.parent
    return resolved.name


def test_written_file_shows_up_as_disk_write_bytes(tmp_path: pathlib.Path) -> None:
    disk_name = _whole_disk_of(tmp_path)
    if disk_name is None:
        pytest.skip(f"{tmp_path} is not on a block device (tmpfs or overlay)")
    collector = HostCollector(1.0)
    collector.collect()
    started = time.monotonic()
    size = 32 << 20
    with open(tmp_path / "blob", "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
    collector.collect()
    elapsed = time.monotonic() - started
    disk = next(d for d in snapshot_of(collector).disks if d.name == disk_name)
    assert disk.write_bytes_per_s * elapsed >= size * 0.9
    assert disk.write_iops > 0
    assert disk.writes_total > 0 and disk.busy_seconds_total > 0
    assert 0.0 <= disk.busy_percent <= 100.0


def test_partitions_and_loop_devices_are_not_reported() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    names = [d.name for d in snapshot_of(collector).disks]
    assert all(not name.startswith(("loop", "ram", "zram")) for name in names)
    assert all(pathlib.Path("/sys/block", name).exists() for name in names)


def test_cpu_shares_of_two_readings() -> None:
    before = CpuTimes(user=10, nice=0, system=5, idle=80, iowait=5, irq=0, softirq=0, steal=0)
    after = CpuTimes(user=40, nice=0, system=15, idle=130, iowait=15, irq=0, softirq=0, steal=0)
    shares = cpu_shares(before, after)
    assert (shares.user_percent, shares.system_percent, shares.idle_percent, shares.iowait_percent) == (30.0, 10.0, 50.0, 10.0)
    assert cpu_shares(after, before) == Unavailable(COUNTER_RESET)
