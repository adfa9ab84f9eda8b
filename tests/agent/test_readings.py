"""The readings kit: counter rates and their reasons, and how readings land in proto messages."""

from __future__ import annotations

from agentd.collectors.readings import (
    COUNTER_RESET,
    FIRST_SAMPLE,
    NO_TIME_ELAPSED,
    Unavailable,
    counter_rate,
    put,
    put_unavailable,
    scaled,
)
from agentd.proto import tuiprof_agent_pb2 as pb


def test_counter_rate_and_the_reasons_it_has_none() -> None:
    assert counter_rate(None, 10, 1.0) == Unavailable(FIRST_SAMPLE)
    assert counter_rate(20, 10, 1.0) == Unavailable(COUNTER_RESET)
    assert counter_rate(10, 30, 0.0) == Unavailable(NO_TIME_ELAPSED)
    assert counter_rate(10, 30, 2.0) == 10.0
    assert counter_rate(10, 10, 2.0) == 0.0  # an idle counter is a true zero, not a missing one


def test_scaled_converts_units_and_passes_reasons_through() -> None:
    assert scaled(1500, 1e-3) == 1.5
    assert scaled(Unavailable("NVML: Not Supported"), 1e-3) == Unavailable("NVML: Not Supported")


def test_put_sets_the_field_or_records_why_not() -> None:
    stats = pb.GpuStats()
    put(stats, "power_watts", Unavailable("NVML: Not Supported"))
    put(stats, "temperature_celsius", 41.0)
    put(stats, "ecc_corrected_total", 3)
    assert not stats.HasField("power_watts")
    assert dict(stats.unavailable) == {"power_watts": "NVML: Not Supported"}
    assert (stats.temperature_celsius, stats.ecc_corrected_total) == (41.0, 3)


def test_put_unavailable_gives_every_field_the_one_reason() -> None:
    nic = pb.NicStats(name="eth0")
    put_unavailable(nic, ("rx_bytes_per_s", "tx_bytes_per_s"), FIRST_SAMPLE)
    assert dict(nic.unavailable) == {"rx_bytes_per_s": FIRST_SAMPLE, "tx_bytes_per_s": FIRST_SAMPLE}
    assert not nic.HasField("rx_bytes_per_s")
