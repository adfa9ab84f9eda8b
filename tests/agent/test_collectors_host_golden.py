"""The host collector over a fixture /proc and /sys, compared with a checked-in rendering (node_exporter's e2e-output).

The collector reads a copy of ``data/host_fixture`` (where its files came from: its README), with
the sysfs links its ``symlinks.txt`` lists made in the copy, twice, one
second apart by its clock: the tree as it is, then with ``second_reading/`` copied over it.
The two snapshots' host parts, in protobuf text format, must equal ``data/host.golden.txtpb``:
any change to a host figure, a reason or a field fails here. When the change is intended,
regenerate with

    TUIPROF_UPDATE_GOLDEN=1 .venv/bin/pytest tests/agent/test_collectors_host_golden.py

and commit the new golden file with the code, after reading its diff.

What does not come from the tree is fixed here: the uptime (the readers take CLOCK_BOOTTIME;
here it is the fixture's /proc/uptime), USER_HZ (the fixture's machine's, 100) and each NIC's
ethtool answer (the ioctl asks the agent's own network namespace).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest
from google.protobuf import text_format

from agentd.collectors import host_cpu
from agentd.collectors.ethtool import NO_STATISTICS
from agentd.collectors.host import HostCollector
from agentd.collectors.host_roots import HostRoots
from agentd.collectors.readings import Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

DATA = pathlib.Path(__file__).parent / "data"
FIXTURE = DATA / "host_fixture"
GOLDEN = DATA / "host.golden.txtpb"
UPDATE = os.environ.get("TUIPROF_UPDATE_GOLDEN") == "1"

# What ``ethtool -S`` gives of the pause counters, per NIC and reading (lo and ifb0: none at all).
PAUSES: tuple[dict[str, dict[str, int]], ...] = (
    {"eth0": {}, "ens1f0np0": {"tx_pause_ctrl_phy": 118, "tx_prio3_pause": 97}},
    {"eth0": {}, "ens1f0np0": {"tx_pause_ctrl_phy": 131, "tx_prio3_pause": 108}},
)


def rendered(tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both readings of ``tree`` (a copy of the fixture: the second reading is copied over it)."""
    roots = HostRoots(proc=str(tree / "proc"), sys=str(tree / "sys"))
    monkeypatch.setattr(host_cpu, "_TICKS_PER_SECOND", 100)
    monkeypatch.setattr(host_cpu, "uptime_seconds", lambda: float((tree / "proc" / "uptime").read_text().split()[0]))
    now = [1000.0]
    collector = HostCollector(1.0, clock=lambda: now[0], roots=roots)
    reading = [0]

    def ethtool(nic: str, only: object = None) -> dict[str, int] | Unavailable:
        return PAUSES[reading[0]].get(nic, NO_STATISTICS)

    monkeypatch.setattr(collector._ethtool, "read", ethtool)

    def sample(title: str) -> str:
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        return f"# {title}\n{text_format.MessageToString(snapshot)}"

    first = sample("first reading")
    shutil.copytree(FIXTURE / "second_reading", tree, dirs_exist_ok=True)  # files rewritten in place: kept fds see them
    now[0] += 1.0
    reading[0] = 1
    second = sample("second reading, one second later")
    collector.close()
    return f"{first}\n{second}"


def make_links(tree: pathlib.Path) -> None:
    """The fixture's sysfs links (not checked in as links: they loop, see ``symlinks.txt``)."""
    for line in (FIXTURE / "symlinks.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            link, target = line.split(" -> ")
            (tree / link).parent.mkdir(parents=True, exist_ok=True)
            (tree / link).symlink_to(target)


def test_two_readings_of_the_fixture_render_as_the_golden_file(tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "host"
    shutil.copytree(FIXTURE, tree, ignore=shutil.ignore_patterns("second_reading", "README.md", "symlinks.txt"))
    make_links(tree)
    text = rendered(tree, monkeypatch)
    if UPDATE:
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"{GOLDEN} is missing; create it with TUIPROF_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), (
        "the host collector's output over the fixture changed; if intended, regenerate with "
        "TUIPROF_UPDATE_GOLDEN=1 .venv/bin/pytest tests/agent/test_collectors_host_golden.py and commit the diff")


def test_the_second_reading_has_every_rate() -> None:
    """The golden file's second snapshot has rates where the fixture's devices counted: a check of the fixture."""
    second = GOLDEN.read_text().split("# second reading, one second later\n")[1]
    snapshot = text_format.Parse(second, pb.HostSnapshot())
    assert snapshot.cpu.HasField("user_percent") and all(core.HasField("idle_percent") for core in snapshot.cpu.cores)
    assert [node.node for node in snapshot.cpu.numa_nodes] == [0] and snapshot.cpu.numa_nodes[0].HasField("user_percent")
    assert [disk.name for disk in snapshot.disks] == ["vda"] and snapshot.disks[0].write_bytes_per_s > 0
    assert [nic.name for nic in snapshot.nics] == ["ens1f0np0", "eth0", "ifb0", "lo"]
    assert next(nic for nic in snapshot.nics if nic.name == "ens1f0np0").rx_bytes_per_s == 25_000_000
    assert [port.device for port in snapshot.rdma.ports] == ["mlx5_0"] and snapshot.rdma.ports[0].netdev == "ens1f0np0"
