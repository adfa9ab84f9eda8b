"""Small things the console shows: zero readings, swap, IOPS, the trend's series, the ▼ marker,
the sorted column, and filter terms that are not what they look like."""

from __future__ import annotations

import pytest

from console.recordings import AGENTS_RECORDING, replay_app
from console.test_app_pilot import SIZE, detail, settle
from tuiprof.model import units
from tuiprof.model.filter import Comparison, FilterError, HostFilter
from tuiprof.model.values import Unavailable
from tuiprof.tui.host_grid import HostGrid
from tuiprof.tui.screens.host import _swap


def test_zero_readings_read_as_zero():
    assert units.seconds(0.0) == "0 s" and units.bytes_(0) == "0 B"
    assert units.per_s(4.0, "") == "4.00" and units.per_s(0.0) == "0 /s"
    assert units.seconds(0.00085) == "850 µs"


def test_elapsed_time_reads_as_ps_writes_it():
    assert [units.elapsed(v) for v in (0, 65.9, 3 * 3600 + 4 * 60 + 5, 2 * 86400 + 7)] == [
        "00:00", "01:05", "3:04:05", "2-00:00:07"]


def test_unavailable_readings_are_named_in_words_not_field_names():
    from tuiprof.tui.text import field_label, reasons

    assert [field_label(name) for name in ("nvlink_rx_bytes_per_s", "gc_pause_seconds_per_s", "sm_percent",
                                           "start_time_unix_seconds", "uptime_seconds", "nvml_failed_queries",
                                           "interrupts_total", "seconds")] == [
        "NVLink rx", "GC pause", "SM", "start time", "uptime", "NVML failed queries", "interrupts total", "seconds"]
    why = Unavailable("not reported by the agent")
    assert reasons({"pcie_rx_bytes_per_s": why, "pcie_tx_bytes_per_s": why, "power_watts": 300.0}) == [
        "PCIe rx, PCIe tx: n/a (not reported by the agent)"]


def test_a_host_without_swap_says_so():
    assert _swap(0, 0) == "no swap"
    assert _swap(512, 2**30) == "swap 512 B/1.00 GiB"


def test_filter_fields_ignore_case_and_comparisons_are_never_name_searches():
    (term,) = HostFilter.parse("CPU>10").terms
    assert term == Comparison("cpu_percent", term.compare, 10.0)
    with pytest.raises(FilterError, match="'gpu-mem>5': not a comparison; write FIELD OP NUMBER"):
        HostFilter.parse("gpu-mem>5")
    with pytest.raises(FilterError, match="unknown hang level 'bogus'; levels: ok, suspect, hung"):
        HostFilter.parse("hang=bogus")
    assert HostFilter.parse("hang=HUNG").terms[0].level == "hung"


async def test_worst_marker_trend_and_sorted_column_are_explained(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        assert "▼ worst host (w)" in gpu_app.screen.sub_title
        await pilot.press("w")
        text = detail(gpu_app)
        assert "▼ the host most in need of attention" in text
        grid = gpu_app.screen.query_one("#hosts", HostGrid)
        host = next(c for c in grid.columns if c.key == "host")
        assert grid._header_label(host).plain == "Host↑"
        await pilot.press("I")
        assert grid._header_label(host).plain == "Host↓"
        await pilot.press("full_stop")
        assert grid._header_label(host).plain == "Host"
        assert grid._header_label(grid.columns[1]).style == "underline"
        await pilot.press("g")
        assert "trend: mean GPU utilization" in detail(gpu_app)


async def test_trend_of_a_gpu_less_host_says_it_plots_cpu() -> None:
    app = replay_app(AGENTS_RECORDING)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        assert "trend: CPU busy (no GPU readings)" in detail(app)


def test_the_pmu_tab_says_what_it_counts_over_and_why_a_counter_is_missing():
    from agentd.proto import tuiprof_agent_pb2 as pb
    from tuiprof.model import convert
    from tuiprof.model.messages import PmuStats
    from tuiprof.tui.screens.host import pmu_rows

    pmu = convert.from_proto(PmuStats, pb.PmuStats(
        scope="process", hardware_available=False, hardware_reason="ENOENT: no PMU", task_clock_cpus=0.01,
        unavailable={"mips": "no hardware counters"}))
    rows = {key: [str(cell) for cell in cells] for key, cells, _ in pmu_rows(pmu)}
    assert rows["scope"] == ["counted over", "per process: the ranks' own processes only (host-wide needs root, "
                                             "CAP_PERFMON or perf_event_paranoid <= 0)"]
    assert rows["mips"] == ["instructions (millions/s)", "n/a: no hardware counters"]
    assert rows["task_clock_cpus"] == ["CPUs busy (task clock)", "0.01"]
