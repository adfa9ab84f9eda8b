"""The ethtool statistics reader against this host's real NICs and the real ``ethtool -S``."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from agentd.collectors.ethtool import ETHTOOL_GSSET_INFO, EthtoolStats
from agentd.collectors.host import HostCollector
from agentd.collectors.host_netdev import PAUSE_COUNTERS, nic_driver, pause_counters
from agentd.collectors.host_roots import STATIC_REFRESH_SECONDS
from agentd.collectors.readings import Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

ETHTOOL = shutil.which("ethtool")


def ethtool_s(nic: str) -> dict[str, int]:
    """``ethtool -S nic`` parsed: "     name: value" lines after the header."""
    output = subprocess.run([ETHTOOL, "-S", nic], capture_output=True, text=True, timeout=10, check=True).stdout
    pairs = (line.strip().rsplit(": ", 1) for line in output.splitlines()[1:] if ": " in line)
    return {name: int(value) for name, value in pairs}


@pytest.fixture
def reader():
    stats = EthtoolStats()
    yield stats
    stats.close()


@pytest.mark.skipif(ETHTOOL is None, reason="ethtool not installed (apt package ethtool)")
def test_every_nic_reads_as_ethtool_prints_it(reader) -> None:
    compared = 0
    for nic in sorted(os.listdir("/sys/class/net")):
        before = reader.read(nic)
        if isinstance(before, Unavailable):
            continue
        printed = ethtool_s(nic)
        after = reader.read(nic)
        assert isinstance(after, dict)
        assert list(before) == list(printed) == list(after), nic  # the same names, in the driver's order
        for name, value in printed.items():
            assert before[name] <= value <= after[name], (nic, name)  # counters only grow
        compared += 1
    if not compared:
        pytest.skip("no NIC here has ethtool statistics")


def test_only_the_wanted_statistics_are_read_and_none_wanted_reads_no_values(reader, monkeypatch) -> None:
    requests: list[int] = []
    send = reader._request
    monkeypatch.setattr(reader, "_request", lambda nic, buffer: requests.append(buffer.raw[0]) or send(nic, buffer))
    compared = 0
    for nic in sorted(os.listdir("/sys/class/net")):
        every = reader.read(nic)
        if isinstance(every, Unavailable) or len(every) < 2:
            continue
        names = list(every)
        chosen = reader.read(nic, only=[names[-1], "no_such_statistic", names[0]])
        after = reader.read(nic)
        assert isinstance(after, dict)
        assert list(chosen) == [names[0], names[-1]]  # in the driver's order
        for name, value in chosen.items():
            assert every[name] <= value <= after[name], (nic, name)
        requests.clear()
        assert reader.read(nic, only=["no_such_statistic"]) == {}
        assert requests == [ETHTOOL_GSSET_INFO]  # the count only: no ETHTOOL_GSTATS
        compared += 1
    if not compared:
        pytest.skip("no NIC here has two ethtool statistics or more")


def test_nics_without_statistics_say_why(reader) -> None:
    assert reader.read("lo") == Unavailable("the driver reports no ethtool statistics")
    assert reader.read("no-such-nic0") == Unavailable("ethtool statistics cannot be read (No such device)")


def test_only_dynologs_pause_counters_are_kept() -> None:
    stats = {"rx_drops": 5, "tx_prio3_pause": 7, "tx_pause_ctrl_phy": 9, "tx_prio3_pause_duration": 1}
    assert pause_counters(stats, "mlx5_core") == {"tx_pause_ctrl_phy": 9, "tx_prio3_pause": 7}
    assert pause_counters({"rx_drops": 5}, "virtio_net") == Unavailable(
        "the driver (virtio_net) has none of the pause counters dynolog reads")
    assert pause_counters(Unavailable("gone"), "x") == Unavailable("gone")
    assert len(PAUSE_COUNTERS) == 11


def test_the_driver_of_a_nic_from_sysfs(tmp_path: pathlib.Path) -> None:
    (tmp_path / "drivers" / "mlx5_core").mkdir(parents=True)
    (tmp_path / "ens1f0np0" / "device").mkdir(parents=True)
    (tmp_path / "ens1f0np0" / "device" / "driver").symlink_to(tmp_path / "drivers" / "mlx5_core")
    (tmp_path / "veth0").mkdir()
    assert nic_driver("ens1f0np0", str(tmp_path)) == "mlx5_core"
    assert nic_driver("veth0", str(tmp_path)) == "virtual NIC"


def test_the_host_collector_gives_each_nic_its_pause_counters_or_the_reason() -> None:
    collector = HostCollector(1.0)
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    collector.close()
    assert snapshot.nics
    for nic in snapshot.nics:
        assert bool(nic.ethtool_stats) != ("ethtool_stats" in nic.unavailable), nic.name
        assert {stat.name for stat in nic.ethtool_stats} <= set(PAUSE_COUNTERS)
    assert next(n for n in snapshot.nics if n.name == "lo").unavailable["ethtool_stats"] == \
        "the driver reports no ethtool statistics"


def test_a_nic_without_pause_counters_is_asked_again_only_after_the_refresh(monkeypatch) -> None:
    now = [0.0]
    collector = HostCollector(1.0, clock=lambda: now[0])
    asked: list[str] = []
    read = collector._ethtool.read
    monkeypatch.setattr(collector._ethtool, "read", lambda nic, only=None: asked.append(nic) or read(nic, only))
    for at in (0.0, 1.0, 2.0, STATIC_REFRESH_SECONDS + 0.5):
        now[0] = at
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        assert next(n for n in snapshot.nics if n.name == "lo").unavailable["ethtool_stats"] == \
            "the driver reports no ethtool statistics"
    collector.close()
    assert asked.count("lo") == 2  # at 0 and after the refresh
