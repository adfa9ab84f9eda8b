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

from agentd.collectors.host import CpuTimes, HostCollector, cpu_shares, read_interrupt_counts, read_uptime
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
    modes = ("user", "system", "idle", "iowait", "nice", "irq", "softirq", "steal", "guest", "guest_nice")
    assert dict(cpu.unavailable) == {f"{mode}_percent": FIRST_SAMPLE for mode in modes}
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
    before = CpuTimes(user=10, nice=0, system=5, idle=80, iowait=5, irq=0, softirq=0, steal=0, guest=0, guest_nice=0)
    after = CpuTimes(user=40, nice=0, system=15, idle=124, iowait=15, irq=2, softirq=2, steal=2, guest=20, guest_nice=0)
    shares = cpu_shares(before, after)  # 100 s elapsed: guest is inside user, so not added to the total
    assert (shares.user_percent, shares.system_percent, shares.idle_percent, shares.iowait_percent) == (30.0, 10.0, 44.0, 10.0)
    assert (shares.irq_percent, shares.softirq_percent, shares.steal_percent, shares.guest_percent) == (2.0, 2.0, 2.0, 20.0)
    assert cpu_shares(after, before) == Unavailable(COUNTER_RESET)


def proc_stat() -> dict[str, list[int]]:
    """/proc/stat read here, independently of psutil and of the collector's parser."""
    return {line.split()[0]: [int(word) for word in line.split()[1:]]
            for line in pathlib.Path("/proc/stat").read_text().splitlines()}


def test_uptime_mode_seconds_and_interrupt_counts_match_proc() -> None:
    user_hz = os.sysconf("SC_CLK_TCK")
    before = proc_stat()
    uptime_before = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    collector = HostCollector(1.0)
    collector.collect()
    after = proc_stat()
    uptime_after = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    cpu = snapshot_of(collector).cpu
    assert uptime_before <= cpu.uptime_seconds <= uptime_after
    assert before["intr"][0] <= cpu.interrupts_total <= after["intr"][0]
    assert before["softirq"][0] <= cpu.softirqs_total <= after["softirq"][0]
    # /proc/stat "cpu" columns: user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    modes = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
    for column, mode in enumerate(modes):
        low, high = before["cpu"][column] / user_hz, after["cpu"][column] / user_hz
        assert low - 0.01 <= getattr(cpu.seconds_total, mode) <= high + 0.01, mode


def test_packet_counters_count_udp_datagrams_on_loopback() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    before = nic(snapshot_of(collector), "lo")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    with receiver, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for _ in range(200):
            sender.sendto(b"x", receiver.getsockname())
    collector.collect()
    after = nic(snapshot_of(collector), "lo")
    # Every datagram crosses lo once each way; other loopback traffic may add more.
    assert after.rx_packets_total - before.rx_packets_total >= 200
    assert after.tx_packets_total - before.tx_packets_total >= 200


def test_unreadable_proc_files_give_reasons(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "missing")
    uptime = read_uptime(missing)
    assert isinstance(uptime, Unavailable) and uptime.reason.startswith(f"cannot read {missing}")
    assert isinstance(read_interrupt_counts(missing), Unavailable)
    stat = tmp_path / "stat"
    stat.write_text("cpu 1 2 3 4\nintr 77 1 2\n")
    assert read_interrupt_counts(str(stat)) == {"intr": 77}
