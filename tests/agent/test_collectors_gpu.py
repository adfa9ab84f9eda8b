"""GpuCollector: the real "no driver" path here, and the per-field conversions on real pynvml structures.

There is no NVIDIA driver on the CI machine, so the collector must report
NVML's own error and fill nothing. The conversions (GPM metric structs, field
value unions, clock-event masks, error caching) are exercised on the ctypes
structures and error classes of the real pynvml module. The real GPU path is
run on a GPU machine (bench/agent/agentd_metrics_gpu.md).
"""

from __future__ import annotations

import math

import pynvml
import pytest

from agentd.collectors import gpu
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_loads()


@pytest.mark.skipif(HAS_NVML, reason="an NVIDIA driver is present: the no-driver path cannot be reached")
def test_without_a_driver_the_collector_says_why_and_fills_nothing() -> None:
    collector = gpu.GpuCollector(1.0)
    status = collector.status()
    assert not status.available
    with pytest.raises(pynvml.NVMLError) as caught:
        pynvml.nvmlInit()
    assert status.reason == f"NVML: {caught.value}"  # NVML's own words, e.g. "NVML Shared Library Not Found"
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    assert len(snapshot.gpus) == 0
    info = pb.AgentInfo()
    collector.describe(info)
    assert (info.driver_version, info.nvml_version, info.cuda_driver_version, len(info.gpus)) == ("", "", "", 0)
    collector.close()


@pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver here")
def test_with_a_driver_every_gpu_is_sampled() -> None:
    collector = gpu.GpuCollector(1.0)
    try:
        assert collector.status().available, collector.status().reason
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        info = pb.AgentInfo()
        collector.describe(info)
        assert len(snapshot.gpus) == pynvml.nvmlDeviceGetCount() == len(info.gpus)
        for stats, static in zip(snapshot.gpus, info.gpus, strict=True):
            assert stats.uuid == static.uuid and stats.uuid.startswith("GPU-")
            assert stats.memory_used_bytes <= stats.memory_total_bytes == static.memory_total_bytes
            assert stats.sm_clock_hz > 0 and stats.power_watts > 0
    finally:
        collector.close()


def gpm_result(values: list[tuple[int, float]]) -> pynvml.c_nvmlGpmMetricsGet_t:
    """A GPM metrics struct as NVML would leave it: (nvmlReturn, value) per GPM_METRICS entry."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    gpu.prepare_gpm_request(request, pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t())
    for index, (code, value) in enumerate(values):
        request.metrics[index].nvmlReturn = code
        request.metrics[index].value = value
    return request


def test_gpm_request_asks_for_every_metric() -> None:
    request = gpm_result([])
    assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
    assert request.numMetrics == len(gpu.GPM_METRICS)
    assert [request.metrics[i].metricId for i in range(request.numMetrics)] == [m for _, m, _ in gpu.GPM_METRICS]


def test_gpm_values_convert_units_and_keep_failures_as_reasons() -> None:
    fields = [field for field, _, _ in gpu.GPM_METRICS]
    values = [(pynvml.NVML_SUCCESS, 10.0 + index) for index in range(len(fields))]
    values[fields.index("dram_active_percent")] = (pynvml.NVML_SUCCESS, math.nan)
    values[fields.index("fp64_active_percent")] = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)
    result = gpu.gpm_values(gpm_result(values))
    assert result["sm_active_percent"] == 10.0 + fields.index("sm_active_percent")
    pcie_tx = 10.0 + fields.index("pcie_tx_bytes_per_s")
    assert result["pcie_tx_bytes_per_s"] == pcie_tx * 1024 * 1024  # GPM reports MiB/s
    assert result["gpm_nvlink_rx_bytes_per_s"] == (10.0 + fields.index("gpm_nvlink_rx_bytes_per_s")) * 1024 * 1024
    assert result["dram_active_percent"] == Unavailable("GPM returned NaN for this window")
    assert result["fp64_active_percent"] == Unavailable("GPM: Not Supported")


def test_field_values_are_read_by_their_value_type() -> None:
    value = pynvml.c_nvmlFieldValue_t()
    value.fieldId = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    value.nvmlReturn = pynvml.NVML_SUCCESS
    value.value.ullVal = 2**40 + 5
    assert gpu.field_value(value) == 2**40 + 5
    value.valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
    value.value.dVal = 1.5
    assert gpu.field_value(value) == 1.5
    value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert gpu.field_value(value) == Unavailable("NVML: Not Supported")


def test_clock_event_reason_names() -> None:
    assert gpu.clock_event_reason_names(0) == []
    assert gpu.clock_event_reason_names(pynvml.nvmlClocksEventReasonSwPowerCap) == ["sw_power_cap"]
    mask = pynvml.nvmlClocksEventReasonGpuIdle | pynvml.nvmlClocksEventReasonHwThermalSlowdown | 0x10000
    assert gpu.clock_event_reason_names(mask) == ["gpu_idle", "hw_thermal_slowdown", "unknown_0x10000"]


def test_unsupported_calls_are_made_once_and_transient_errors_retried() -> None:
    calls = {"unsupported": 0, "flaky": 0}

    def unsupported() -> int:
        calls["unsupported"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def flaky() -> int:
        calls["flaky"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    call = gpu.NvmlCalls()
    for _ in range(3):
        assert call(0, "fan", unsupported) == Unavailable("NVML: Not Supported")
        assert call(0, "power", flaky) == Unavailable("NVML: Unknown Error")
    assert call(1, "fan", unsupported) == Unavailable("NVML: Not Supported")  # cached per GPU
    assert calls == {"unsupported": 2, "flaky": 3}
    assert call(0, "ok", lambda value: value * 2, 21) == 42


def test_counter_rates_from_nvml_timestamps() -> None:
    first = gpu.nvml_counter_rate(None, gpu.CounterReading(100, 1_000_000))
    assert first == Unavailable(FIRST_SAMPLE)
    reset = gpu.nvml_counter_rate(gpu.CounterReading(100, 1_000_000), gpu.CounterReading(50, 2_000_000))
    assert reset == Unavailable(COUNTER_RESET)
    # 200 units in 0.5 s of NVML's time
    assert gpu.nvml_counter_rate(gpu.CounterReading(100, 1_000_000), gpu.CounterReading(300, 1_500_000)) == 400.0


def test_versions_and_architectures() -> None:
    assert gpu.cuda_version_text(12080) == "12.8"
    assert gpu.cuda_version_text(13000) == "13.0"
    assert gpu.architecture_name(pynvml.NVML_DEVICE_ARCH_HOPPER) == "Hopper"
    assert gpu.architecture_name(99) == "unknown (99)"
    assert gpu.text(b"NVIDIA H200") == gpu.text("NVIDIA H200") == "NVIDIA H200"


def test_nvml_calls_are_counted_per_function_as_made() -> None:
    def nvmlDeviceGetFanSpeed(handle: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPowerUsage(handle: int) -> int:
        return 300_000

    call = gpu.NvmlCalls()
    for _ in range(3):
        call(0, "fan", nvmlDeviceGetFanSpeed, 0)
        call(0, "power", nvmlDeviceGetPowerUsage, 0)
    call(0, "helper", lambda: None)  # not an NVML function: not counted
    assert call.made == {"nvmlDeviceGetFanSpeed": 1, "nvmlDeviceGetPowerUsage": 3}  # "not supported": asked once
    assert call.is_permanent(0, "fan") and not call.is_permanent(0, "power") and not call.is_permanent(1, "fan")
