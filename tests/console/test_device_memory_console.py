"""A rank's device memory in the console: the ranks tab's Device memory column and `tuiprof status --json`."""

from __future__ import annotations

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived
from tuiprof.model.export import cluster_document
from tuiprof.model.messages import HostSnapshot
from tuiprof.tui.screens.host import RANK_COLUMNS, rank_rows

NOT_READ = "the segment was mid-update when read: this interval's work is counted in the next one"
CPU_TORCH = "no PyTorch caching allocator figures: this torch is a CPU build (torch.version.cuda is None)"


def snapshot() -> pb.HostSnapshot:
    training = pb.RankStats(pid=10, rank=0, device_memory=pb.DeviceMemoryStats(
        malloc=pb.DeviceAllocations(malloc_calls_total=12, malloc_bytes_total=3 << 30),
        copies=[pb.MemoryCopies(direction="host_to_device", calls_total=400, bytes_total=4 << 20,
                                bytes_per_s=2e9, mean_seconds=2e-5, seconds_total=8e-3),
                pb.MemoryCopies(direction="device_to_host", calls_total=3, bytes_total=12,
                                unavailable={"bytes_per_s": NOT_READ}),
                pb.MemoryCopies(direction="default", calls_total=1, bytes_total=8, bytes_per_s=8.0)],
        allocated_bytes=12 << 30, reserved_bytes=14 << 30, peak_allocated_bytes=13 << 30, alloc_retries_total=0,
        ooms_total=1, allocator_age_seconds=0.5))
    cpu = pb.RankStats(pid=11, rank=1, device_memory=pb.DeviceMemoryStats(
        unavailable=dict.fromkeys(("allocated_bytes", "ooms_total"), CPU_TORCH)))
    return pb.HostSnapshot(ranks=[training, cpu])


def test_ranks_tab_shows_allocated_of_reserved_and_host_device_copy_rates() -> None:
    rows = {key: cells for key, cells, _ in rank_rows(HostSnapshot.from_proto(snapshot()))}
    column = [c.label for c in RANK_COLUMNS].index("Device memory")
    assert str(rows["rank 0"][column]) == "12.0 GiB/14.0 GiB H2D 2.00 GB/s"  # D2H not read, default not shown
    assert str(rows["rank 1"][column]) == "none"


def test_status_json_has_the_device_memory_and_why_figures_are_missing() -> None:
    cluster = ClusterState(["n1"])
    cluster.apply(SnapshotReceived("n1", 1.0, snapshot()))
    training, cpu = cluster_document(cluster)["hosts"][0]["ranks"]
    memory = training["device_memory"]
    assert memory["allocated_bytes"] == 12 << 30 and memory["ooms_total"] == 1
    assert memory["malloc"]["malloc_calls_total"] == 12
    assert memory["copies"][0]["direction"] == "host_to_device" and memory["copies"][0]["seconds_total"] == 8e-3
    assert cpu["device_memory"]["allocated_bytes"] is None  # never 0: null, and why
    assert cpu["device_memory"]["unavailable"]["allocated_bytes"] == CPU_TORCH
