"""History with sample times, the per-GPU/per-core samples, and the pieces of a plot's axes."""

from __future__ import annotations

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model.history import History
from tuiprof.model.values import Unavailable
from tuiprof.tui.plots import Line, busiest, detail_samples, time_ticks
from tuiprof.tui.tables import fit_columns


def test_points_line_up_with_their_sample_times_across_gaps_and_late_series() -> None:
    history = History(capacity=3)
    history.extend([("cpu", 10.0)], at=100.0)
    history.extend([("cpu", Unavailable("collector down")), ("gpu0.util", 50.0)], at=101.0)
    history.extend([("cpu", 30.0)], at=102.0)  # gpu0 missing from this sample: a gap, not a shift
    history.extend([("cpu", 40.0), ("gpu0.util", 70.0)], at=103.0)  # capacity 3: t=100 falls out
    assert history.points("cpu") == [(102.0, 30.0), (103.0, 40.0)]
    assert history.points("gpu0.util") == [(101.0, 50.0), (103.0, 70.0)]
    assert history.series("gpu") == ["gpu0.util"] and history.points("nosuch") == []


def test_detail_samples_per_gpu_and_per_core_with_unavailable_kept_as_such() -> None:
    message = pb.HostSnapshot()
    gpu = message.gpus.add(index=3, utilization_percent=80.0, memory_used_bytes=20, memory_total_bytes=80)
    gpu.unavailable["power_watts"] = "NVML: not supported"
    message.cpu.cores.add(cpu=0, idle_percent=25.0)
    samples = dict(detail_samples(message))
    assert samples["gpu3.util"] == 80.0 and samples["gpu3.memory"] == 25.0 and samples["core0.busy"] == 75.0
    assert samples["gpu3.power"] == Unavailable("NVML: not supported")


def test_time_ticks_are_round_and_end_now() -> None:
    assert time_ticks(300) == [-300.0, -240.0, -180.0, -120.0, -60.0, 0.0]
    assert time_ticks(60) == [-60.0, -45.0, -30.0, -15.0, 0.0]
    assert time_ticks(900)[-1] == 0.0 and len(time_ticks(900)) <= 6


def test_busiest_keeps_the_highest_latest_values_in_their_order() -> None:
    lines = [Line(f"core{i}", [(0.0, float(v))]) for i, v in enumerate([5, 90, 10, 80, 70])]
    assert [line.label for line in busiest(lines, keep=3)] == ["core1", "core3", "core4"]


def test_fit_columns_keeps_the_first_then_the_highest_priorities_that_fit() -> None:
    priorities, widths = [100, 10, 90, 50, 80], [10, 5, 10, 20, 10]
    assert fit_columns(priorities, widths, room=100, gap=2) == [0, 1, 2, 3, 4]
    assert fit_columns(priorities, widths, room=40, gap=2) == [0, 2, 4]
    assert fit_columns(priorities, widths, room=40, gap=2, hidden={2}) == [0, 1, 4]
    assert fit_columns(priorities, widths, room=5, gap=2) == [0, 2]  # too narrow: scroll sideways
