"""HostCollector against the machine it runs on: psutil's counters, real traffic, real disk writes."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from agentd.collectors import host_cpu, host_diskstats, host_numa
from agentd.collectors.host import HostCollector
from agentd.collectors.host_cpu import (
    CpuShares,
    ProcessCount,
    count_processes,
    cpu_shares,
    parse_loadavg,
    parse_proc_stat,
    read_proc_stat,
)
from agentd.collectors.host_devices import Unwrapped
from agentd.collectors.host_diskstats import DiskCounters, disk_counters, parse_diskstats
from agentd.collectors.host_memory import memory_stats
from agentd.collectors.host_netdev import parse_net_dev
from agentd.collectors.host_numa import NodeTimes, fill_numa_nodes, parse_cpulist, read_numa_nodes
from agentd.collectors.host_rdma import RdmaReader
from agentd.collectors.host_roots import STATIC_REFRESH_SECONDS, HostRoots
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable
from agentd.procfs import OpenProcFile, read_whole
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
    before = pb.CpuModeSeconds(user=10, nice=0, system=5, idle=80, iowait=5, irq=0, softirq=0, steal=0, guest=0,
                               guest_nice=0)
    after = pb.CpuModeSeconds(user=40, nice=0, system=15, idle=124, iowait=15, irq=2, softirq=2, steal=2, guest=20,
                              guest_nice=0)
    shares = cpu_shares(before, after)  # 100 s elapsed: guest is inside user, so not added to the total
    assert (shares.user_percent, shares.system_percent, shares.idle_percent, shares.iowait_percent) == (30.0, 10.0, 44.0, 10.0)
    assert (shares.irq_percent, shares.softirq_percent, shares.steal_percent, shares.guest_percent) == (2.0, 2.0, 2.0, 20.0)
    assert cpu_shares(after, before) == Unavailable(COUNTER_RESET)
    # Modes can go backwards (iowait, a kernel quirk): each share is clamped to [0, 100].
    went_back = pb.CpuModeSeconds(user=5, nice=0, system=5, idle=180, iowait=0)
    backwards = cpu_shares(before, went_back)  # 90 s elapsed, 100 s idle
    assert isinstance(backwards, CpuShares)
    assert (backwards.user_percent, backwards.iowait_percent, backwards.idle_percent) == (0.0, 0.0, 100.0)


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


def test_read_whole_reads_past_one_read_and_generated_proc_files(tmp_path: pathlib.Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(200_000))  # more than one 64 KiB read
    assert read_whole(str(blob)) == blob.read_bytes()
    assert read_whole("/proc/self/status").startswith(b"Name:")
    with pytest.raises(FileNotFoundError):
        read_whole(str(tmp_path / "missing"))


def test_a_proc_file_kept_open_is_read_whole_and_anew_each_time(tmp_path: pathlib.Path) -> None:
    """What read_whole gives, each time: the file's current content from its start, past one read."""
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(200_000))  # more than one 64 KiB read
    kept = OpenProcFile(str(blob))
    assert kept.read() == read_whole(str(blob))
    with blob.open("r+b") as rewrite:  # same file, new content
        rewrite.write(os.urandom(200_000))
    assert kept.read() == read_whole(str(blob))
    kept.close()
    uptime = OpenProcFile("/proc/uptime")  # generated per read, changes every 10 ms
    readings = []
    for _ in range(3):
        before = float(read_whole("/proc/uptime").split()[0])
        readings.append(float(uptime.read().split()[0]))
        after = float(read_whole("/proc/uptime").split()[0])
        assert before <= readings[-1] <= after
        time.sleep(0.05)
    assert readings == sorted(readings) and readings[0] < readings[-1]
    uptime.close()
    for path in ("/proc/stat", "/proc/meminfo", "/proc/net/dev", "/proc/diskstats", "/proc/loadavg"):
        file = OpenProcFile(path)
        for _ in range(2):  # the same lines as a fresh open gives (their numbers move)
            kept_lines = [line.split()[0] for line in file.read().splitlines()]
            assert kept_lines == [line.split()[0] for line in read_whole(path).splitlines()]
        file.close()


def test_an_unreadable_proc_stat_fails_the_sample(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):  # no CPU figures at all: the runner reports the failed collect
        read_proc_stat(OpenProcFile(str(tmp_path / "missing")))


MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:    9000000 kB
Buffers:          200000 kB
Cached:          6000000 kB
SwapCached:            0 kB
Active:          5000000 kB
Inactive:        4000000 kB
Shmem:            100000 kB
Slab:             500000 kB
SReclaimable:     300000 kB
SwapTotal:       2000000 kB
SwapFree:        1500000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


@pytest.mark.parametrize("available_line", ["MemAvailable:    9000000 kB",  # the kernel's figure
                                            "MemAvailable:          0 kB",  # a kernel bug: psutil estimates
                                            "MemAvailable:   99000000 kB"])  # over the total (a container): MemFree
def test_memory_figures_are_psutils_from_one_read_of_meminfo(tmp_path: pathlib.Path, available_line: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    text = MEMINFO.replace("MemAvailable:    9000000 kB", available_line)
    (tmp_path / "meminfo").write_text(text)
    (tmp_path / "vmstat").write_text("pswpin 10\npswpout 20\n")
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    virtual, swap = psutil.virtual_memory(), psutil.swap_memory()
    memory = memory_stats(text.encode())
    assert (memory.total_bytes, memory.available_bytes, memory.used_bytes) == \
        (virtual.total, virtual.available, virtual.total - virtual.available)
    assert (memory.swap_total_bytes, memory.swap_used_bytes) == (swap.total, swap.used) == (2_048_000_000, 512_000_000)


NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: {lo} 1000    0    0    0     0          0         0 {lo} 1000    0    0    0     0       0          0
  eth0:{eth} 5000    3    4    0     0          0        10 7777 6000    5    6    0     0       0          0
"""
DISKSTATS = """ 253       0 vda {vda} 10 2000 300 40 50 {vda_w} 600 0 700 900 0 0 0 0 0 0
 253       1 vda1 90 1 1800 290 30 40 800 500 0 650 800 0 0 0 0 0 0
   7       0 loop0 5 0 10 0 0 0 0 0 0 1 0 0 0 0 0
"""


def test_nic_and_disk_totals_are_psutils_nowrap_ones_from_one_read_each(tmp_path: pathlib.Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three readings, the second with counters lower than the first (a wrap, as psutil takes it)."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    (tmp_path / "net").mkdir()
    psutil.net_io_counters.cache_clear()
    psutil.disk_io_counters.cache_clear()
    nics, disks = Unwrapped(), Unwrapped()
    for lo, eth, vda in ((900, 2**32 - 10, 100), (50, 30, 20), (70, 40, 25)):
        (tmp_path / "net" / "dev").write_text(NET_DEV.format(lo=lo, eth=eth))
        (tmp_path / "diskstats").write_text(DISKSTATS.format(vda=vda, vda_w=vda * 2))
        expected_nics = psutil.net_io_counters(pernic=True, nowrap=True)
        expected_disks = psutil.disk_io_counters(perdisk=True, nowrap=True)
        read_nics = nics(parse_net_dev((tmp_path / "net" / "dev").read_bytes()))
        read_disks = disks({name: disk_counters(columns)
                            for name, columns in parse_diskstats((tmp_path / "diskstats").read_bytes()).items()})
        assert read_nics.keys() == expected_nics.keys() == {"lo", "eth0"}
        for name, mine in read_nics.items():
            theirs = expected_nics[name]
            assert mine == (theirs.bytes_recv, theirs.bytes_sent, theirs.packets_recv, theirs.packets_sent,
                            theirs.errin, theirs.errout, theirs.dropin, theirs.dropout), name
        assert read_disks.keys() == {"vda", "vda1", "loop0"}
        for name, mine in read_disks.items():
            theirs = expected_disks[name]
            assert mine == (theirs.read_bytes, theirs.write_bytes, theirs.read_count, theirs.write_count,
                            theirs.busy_time), name
    assert read_nics["lo"].rx_bytes == 900 + 70 and read_disks["vda"].reads == 100 + 25  # the wrap was seen
    psutil.net_io_counters.cache_clear()
    psutil.disk_io_counters.cache_clear()


def test_a_device_that_disappears_starts_again_from_its_own_counters() -> None:
    totals = Unwrapped()
    counters = DiskCounters(100, 100, 100, 100, 100)
    assert totals({"sda": counters}) == {"sda": counters}
    low = DiskCounters(1, 1, 1, 1, 1)
    assert totals({"sda": low})["sda"] == (101, 101, 101, 101, 101)  # wrapped: the old value is added
    assert totals({}) == {}
    assert totals({"sda": low})["sda"] == low  # a new device under the old name


def test_uptime_and_process_count_agree_with_proc() -> None:
    before = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    uptime = host_cpu.uptime_seconds()
    after = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    assert before <= uptime <= after and round(uptime, 2) == uptime
    assert count_processes("/proc") == pytest.approx(len(psutil.pids()), abs=20)


def test_the_task_count_is_the_threads_of_every_process() -> None:
    threads = sum(len(os.listdir(f"/proc/{pid}/task")) for pid in os.listdir("/proc") if pid.isdigit()
                  and os.path.exists(f"/proc/{pid}/task"))
    assert parse_loadavg(read_whole("/proc/loadavg")).tasks == pytest.approx(threads, abs=50)  # kernel threads included in both


def test_processes_are_listed_again_only_when_a_task_was_created_or_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    listings = []
    monkeypatch.setattr(host_cpu, "count_processes", lambda _proc: listings.append(1) or 100 + len(listings))
    count = ProcessCount("/proc")
    assert [count(500, 80), count(500, 80), count(501, 81), count(501, 80), count(501, 80)] == [101, 101, 102, 103, 103]
    assert [count(None, 80), count(None, 80)] == [104, 105]  # no "processes" line: listed every time
    assert len(listings) == 5


def test_new_processes_are_counted_by_the_next_sample() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(5)]
    try:
        time.sleep(0.2)
        collector.collect()
        counted = snapshot_of(collector).cpu.process_count
        assert counted == pytest.approx(count_processes("/proc"), abs=3)
    finally:
        for child in children:
            child.kill()
            child.wait()
    collector.collect()
    assert snapshot_of(collector).cpu.process_count == pytest.approx(count_processes("/proc"), abs=3)
    collector.close()


def test_numa_nodes_are_read_again_only_when_the_online_cpus_change_or_after_the_refresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    stats = {"two": "cpu0 1 0 1 10\ncpu1 1 0 1 10\n", "one": "cpu0 2 0 2 20\n"}
    current = ["two"]
    monkeypatch.setattr(host_cpu, "read_proc_stat", lambda _file: parse_proc_stat(stats[current[0]], 100))
    reads = []
    monkeypatch.setattr(host_numa, "read_numa_nodes", lambda _root: reads.append(now[0]) or {0: [0, 1]})
    collector = HostCollector(1.0, clock=lambda: now[0])
    for at, online in ((0.0, "two"), (1.0, "two"), (2.0, "one"), (3.0, "one"), (62.5, "one"), (63.0, "one")):
        now[0], current[0] = at, online
        collector.collect()
    assert reads == [0.0, 2.0, 62.5]
    node = snapshot_of(collector).cpu.numa_nodes[0]
    assert list(node.cpus) == [0] and node.seconds_total.user == 0.02
    collector.close()


def test_whole_disks_are_decided_again_only_when_the_names_change(monkeypatch: pytest.MonkeyPatch) -> None:
    decided = []
    real = host_diskstats.whole_disks
    monkeypatch.setattr(host_diskstats, "whole_disks",
                        lambda names, sys_block: decided.append(list(names)) or real(names, sys_block))
    collector = HostCollector(1.0)
    for _ in range(3):
        collector.collect()
    assert len(decided) == 1
    collector.close()


def test_proc_stat_of_an_old_kernel_without_softirq_line_or_guest_columns() -> None:
    stat = parse_proc_stat("cpu 100 2 30 400\ncpu0 60 1 10 200\ncpu3 40 1 20 200\nintr 77 1 2\n", 100)
    assert stat.total == pb.CpuModeSeconds(user=1.0, nice=0.02, system=0.3, idle=4.0)
    assert sorted(stat.cpus) == [0, 3] and stat.cpus[3].system == 0.2
    assert stat.counts == {"intr": 77}


def test_proc_stat_is_opened_once_and_read_anew_by_each_sample() -> None:
    opened: list[str] = []
    watching = threading.Event()

    def audit(event: str, args: tuple[object, ...]) -> None:
        if watching.is_set() and event == "open" and args[0] == "/proc/stat":
            opened.append(str(args[0]))

    sys.addaudithook(audit)  # hooks cannot be removed: this one only records while the event is set
    collector = HostCollector(1.0)
    watching.set()
    try:
        collector.collect()
        time.sleep(0.1)  # some CPU time passes between the two samples
        collector.collect()
    finally:
        watching.clear()
    assert opened == ["/proc/stat"]  # kept open: no path lookup, open and close per sample
    cpu = snapshot_of(collector).cpu  # rates: the second sample read new times
    assert cpu.HasField("interrupts_total") and cpu.HasField("user_percent") and cpu.cores
    collector.close()


def test_proc_stat_without_the_all_cpus_line_sums_the_cpus() -> None:
    stat = parse_proc_stat("cpu0 60 1 10 200\ncpu1 40 1 20 200\n", 100)
    assert stat.total.user == 1.0 and stat.total.idle == 4.0


def test_numa_node_shares_need_the_same_online_cpus_in_both_samples() -> None:
    def times(user: float, idle: float) -> pb.CpuModeSeconds:
        return pb.CpuModeSeconds(user=user, idle=idle)

    before = {0: NodeTimes((0, 1), times(10, 90)), 1: NodeTimes((2, 3), times(5, 95)), 2: NodeTimes((), times(0, 0))}
    after = {0: NodeTimes((0, 1), times(40, 160)), 1: NodeTimes((2,), times(7, 140)), 2: NodeTimes((), times(0, 0)),
             3: NodeTimes((6,), times(1, 1))}
    cpu = pb.CpuStats()
    fill_numa_nodes(cpu, before, after)
    node0, node1, node2, node3 = cpu.numa_nodes
    assert (node0.user_percent, node0.idle_percent, node0.seconds_total.user) == (30.0, 70.0, 40.0)
    assert node1.unavailable["user_percent"] == "the node's online CPUs changed since the previous sample"
    assert node2.unavailable["idle_percent"] == "none of the node's CPUs is online"
    assert not node2.HasField("seconds_total")  # no time to report, not 0
    assert node3.unavailable["system_percent"] == FIRST_SAMPLE
    without = pb.CpuStats()
    fill_numa_nodes(without, None, Unavailable("no NUMA here"))
    assert not without.numa_nodes and without.unavailable["numa_nodes"] == "no NUMA here"


def test_cpulists_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpulist("5\n") == [5]
    assert parse_cpulist("\n") == []


def _fake_nodes(root: pathlib.Path, cpulists: dict[str, str]) -> None:
    for name, cpulist in cpulists.items():
        (root / name).mkdir(parents=True)
        (root / name / "cpulist").write_text(cpulist + "\n")
    (root / "online").write_text("0-2\n")  # not a node directory


def test_numa_nodes_of_a_fake_two_socket_host_and_of_a_kernel_without_numa(tmp_path: pathlib.Path) -> None:
    _fake_nodes(tmp_path / "node", {"node0": "0-1,4", "node1": "2-3", "node2": ""})  # node2: memory only
    assert read_numa_nodes(str(tmp_path / "node")) == {0: [0, 1, 4], 1: [2, 3]}
    absent = read_numa_nodes(str(tmp_path / "absent"))
    assert isinstance(absent, Unavailable) and "CONFIG_NUMA" in absent.reason
    (tmp_path / "memory-only").mkdir()
    _fake_nodes(tmp_path / "memory-only", {"node0": ""})
    none = read_numa_nodes(str(tmp_path / "memory-only"))
    assert isinstance(none, Unavailable) and "no NUMA node with CPUs" in none.reason


def test_numa_node_times_are_the_sums_of_their_cpus_in_proc_stat() -> None:
    nodes = read_numa_nodes("/sys/devices/system/node")
    if isinstance(nodes, Unavailable):
        pytest.skip(f"this kernel has no NUMA information: {nodes.reason}")
    user_hz = os.sysconf("SC_CLK_TCK")
    before = proc_stat()
    collector = HostCollector(1.0)
    collector.collect()
    after = proc_stat()
    first = snapshot_of(collector).cpu
    assert {node.node: list(node.cpus) for node in first.numa_nodes} == nodes
    for node in first.numa_nodes:
        assert node.unavailable["user_percent"] == FIRST_SAMPLE
        low = sum(before[f"cpu{cpu}"][0] for cpu in node.cpus) / user_hz
        high = sum(after[f"cpu{cpu}"][0] for cpu in node.cpus) / user_hz
        assert low - 0.01 <= node.seconds_total.user <= high + 0.01
    time.sleep(0.1)  # some CPU time passes between the two samples
    collector.collect()
    for node in snapshot_of(collector).cpu.numa_nodes:
        assert not node.unavailable
        assert node.user_percent + node.system_percent + node.idle_percent <= 100.0 + 1e-6  # other modes: the rest
        assert 0.0 <= node.idle_percent <= 100.0


def rdma_of(sys: pathlib.Path, now: float, reader: RdmaReader | None = None) -> pb.RdmaStats:
    """What ``reader`` (a new one over ``sys`` when None) reads at ``now``."""
    snapshot = pb.HostSnapshot()
    (reader or RdmaReader(HostRoots(sys=str(sys)))).read(snapshot, now)
    return snapshot.rdma


def _fake_rdma_device(sys: pathlib.Path, name: str, netdev: str | None) -> pathlib.Path:
    root = sys / "class" / "infiniband"
    port = root / name / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    if netdev:
        (root / name / "device" / "net" / netdev).mkdir(parents=True)
    return port


def test_rdma_counters_of_a_fake_sysfs_tree(tmp_path: pathlib.Path) -> None:
    port = _fake_rdma_device(tmp_path, "mlx5_0", "ens1f0np0")
    (port / "counters" / "port_rcv_errors").write_text("7\n")
    (port / "counters" / "port_xmit_data").write_text("123456789012\n")
    (port / "hw_counters" / "np_cnp_sent").write_text("42\n")
    (port / "hw_counters" / "lifespan").write_text("10\n")  # a setting, not a counter
    (port / "hw_counters" / "rx_icrc_encapsulated").mkdir()  # unreadable as a number: an error with its reason
    bare = _fake_rdma_device(tmp_path, "ibp1s0", None)
    (bare / "counters" / "port_rcv_packets").write_text("5\n")
    os.rmdir(bare / "hw_counters")  # a driver without hw counters
    stats = rdma_of(tmp_path, 0.0)
    assert not stats.unavailable_reason
    first, second = stats.ports
    assert (first.device, first.port, first.netdev) == ("ibp1s0", 1, "")
    assert [(c.name, c.value) for c in first.counters] == [("port_rcv_packets", 5)] and not first.hw_counters
    assert (second.device, second.netdev) == ("mlx5_0", "ens1f0np0")
    assert [(c.name, c.value) for c in second.counters] == [("port_rcv_errors", 7), ("port_xmit_data", 123456789012)]
    sent, unreadable = second.hw_counters
    assert (sent.name, sent.value) == ("np_cnp_sent", 42)
    assert unreadable.name == "rx_icrc_encapsulated" and not unreadable.HasField("value")
    assert dict(unreadable.unavailable) == {"value": "Is a directory"}


def test_rdma_without_a_device_says_why(tmp_path: pathlib.Path) -> None:
    assert "is absent" in rdma_of(tmp_path, 0.0).unavailable_reason
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert "is empty" in rdma_of(tmp_path, 0.0).unavailable_reason


def test_rdma_ports_and_counter_names_are_listed_again_after_the_refresh_or_when_a_device_goes(
        tmp_path: pathlib.Path) -> None:
    port = _fake_rdma_device(tmp_path, "mlx5_0", "ens1f0np0")
    (port / "counters" / "port_rcv_errors").write_text("7\n")
    rdma = RdmaReader(HostRoots(sys=str(tmp_path)))
    assert [c.name for c in rdma_of(tmp_path, 0.0, rdma).ports[0].counters] == ["port_rcv_errors"]
    (port / "counters" / "port_rcv_errors").write_text("8\n")
    (port / "counters" / "port_xmit_data").write_text("9\n")  # a new file: seen after the refresh
    values = rdma_of(tmp_path, 1.0, rdma).ports[0].counters
    assert [(c.name, c.value) for c in values] == [("port_rcv_errors", 8)]
    values = rdma_of(tmp_path, STATIC_REFRESH_SECONDS + 0.5, rdma).ports[0].counters
    assert [(c.name, c.value) for c in values] == [("port_rcv_errors", 8), ("port_xmit_data", 9)]
    shutil.rmtree(tmp_path / "class" / "infiniband" / "mlx5_0")  # the device goes: its counters say why, then it is gone
    gone = rdma_of(tmp_path, STATIC_REFRESH_SECONDS + 1.0, rdma).ports[0].counters[0]
    assert dict(gone.unavailable) == {"value": "No such file or directory"}
    assert "is empty" in rdma_of(tmp_path, STATIC_REFRESH_SECONDS + 2.0, rdma).unavailable_reason


def test_rdma_of_this_host_from_the_collector() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    rdma = snapshot_of(collector).rdma
    infiniband = "/sys/class/infiniband"
    if os.path.isdir(infiniband) and os.listdir(infiniband):
        assert rdma.ports and not rdma.unavailable_reason
        assert {port.device for port in rdma.ports} == set(os.listdir(infiniband))
    else:
        assert not rdma.ports and rdma.unavailable_reason.startswith("no RDMA device")
