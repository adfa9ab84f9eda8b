"""GpuCollector's per-tick code against a fake NVML, so it runs in CI without a GPU.

``FakeNvml`` stands in for the ``pynvml`` module inside agentd.collectors.gpu: it
answers the NVML calls the collector makes with deterministic values (real
pynvml ctypes structures where the collector reads them) and raises real
``pynvml.NVMLError`` subclasses where a test wants a failure. Constants, struct
types and error classes come from the real pynvml; any NVML function the fake
does not implement raises AttributeError, so an unexpected call fails the test.
The real driver path is measured on a GPU machine (bench/agent/agentd_metrics_gpu.md).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import inspect
import json
import math
import os
import pathlib
import subprocess
import sys
import types
from typing import Any

import psutil
import pynvml
import pytest

from agentd import containers
from agentd.collectors import gpu
from agentd.collectors.readings import FIRST_SAMPLE
from agentd.kineto.registry import Registry
from agentd.kineto.rpc import DynologRpc
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.containers import Container
from testkit.namespaces import unavailable_reason

KIB = 1024
MIB = 1024 * 1024
START_US = 1_700_000_000_000_000
NVLINK_RX_KIB_PER_S = 175_781_250  # 180e9 bytes/s
NVLINK_TX_KIB_PER_S = 176_757_812  # 180.999999488e9 bytes/s
DEAD_PID = 2**22 + 17  # above the default pid_max: no such process
GPM_VALUES = {  # metric id -> what the fake's GPM reports for any window
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 99.5,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 87.5,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 31.25,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 55.5,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: math.nan,  # NVML gives NaN for some windows
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.5,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 3.25,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 2000.0,  # MiB/s
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 6500.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 171_000.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 170_000.0,
}
GPM_UNSUPPORTED = {pynvml.NVML_GPM_METRIC_FP64_UTIL}


@dataclasses.dataclass
class FakeGpu:
    name: bytes
    uuid: str
    bus_id: bytes
    architecture: int
    gpm: bool
    nvlink: bool
    temperature_v: bool  # the versioned temperature call exists (newer drivers)
    minor_number: int
    memory_total: int = 80 << 30
    errors: dict[str, int] = dataclasses.field(default_factory=dict)  # call -> NVML error on every call
    errors_once: dict[str, int] = dataclasses.field(default_factory=dict)  # call -> NVML error on the next call
    processes: list[tuple[int, int | None]] = dataclasses.field(default_factory=list)
    # NVML's per-process utilization sample buffer: (NVML time us, pid, SM %), oldest first.
    utilization_samples: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    # Field ids nvmlDeviceGetFieldValues answers NVML_ERROR_NOT_SUPPORTED on this GPU (NVLink: ``nvlink``).
    unsupported_fields: frozenset[int] = frozenset()


HOPPER = FakeGpu(name=b"NVIDIA H200", uuid="GPU-h200", bus_id=b"00000000:19:00.0",
                 architecture=pynvml.NVML_DEVICE_ARCH_HOPPER, gpm=True, nvlink=True, temperature_v=True, minor_number=4,
                 memory_total=141 << 30, processes=[(os.getpid(), 1 << 30), (DEAD_PID, None)])
AMPERE = FakeGpu(name=b"NVIDIA A100-SXM4-80GB", uuid="GPU-a100", bus_id=b"00000000:2A:00.0",
                 architecture=pynvml.NVML_DEVICE_ARCH_AMPERE, gpm=False, nvlink=False, temperature_v=False, minor_number=0,
                 errors={"nvmlDeviceGetEnforcedPowerLimit": pynvml.NVML_ERROR_NOT_SUPPORTED},
                 # GA100 has no 1 s power average (nvml.h), and this one no power limit in either form
                 unsupported_fields=frozenset({pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT}))
POWER_MW = 651_250
POWER_LIMIT_MW = 700_000
ECC_TOTALS = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0}


def nvml(function: Any) -> Any:
    """An NVML entry point of the fake: counted per (GPU, call), failing where the GPU says so."""
    name = function.__name__
    takes_handle = "handle" in inspect.signature(function).parameters

    def call(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        handle = args[0] if takes_handle else None
        self.calls[(handle, name)] += 1
        if isinstance(handle, int):
            device = self.gpus[handle]
            code = device.errors_once.pop(name, None) or device.errors.get(name)
            if code is not None:
                raise pynvml.NVMLError(code)
        return function(self, *args, **kwargs)

    call.__name__ = name
    return call


class FakeNvml:
    """The ``pynvml`` module as gpu.py sees it; handles are GPU indexes."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.now_us = START_US
        self.calls: collections.Counter[tuple[int | None, str]] = collections.Counter()
        self._samples: dict[int, ctypes.Array[ctypes.c_char]] = {}  # address -> buffer kept alive
        self.sampled: list[tuple[int, int, int]] = []  # (gpu, sample address, time us) per nvmlGpmSampleGet
        self.freed: list[int] = []
        self.shut_down = False
        self.utilization_buffer_sizes: list[int] = []  # per nvmlDeviceGetProcessUtilization call: samples it could hold

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)
        if name.startswith("nvml") and inspect.isfunction(real):
            raise AttributeError(f"the fake NVML does not answer {name}: add it to FakeNvml")
        return real  # constants, ctypes structures, NVMLError and its subclasses

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1e6)

    def clock(self) -> float:
        return self.now_us / 1e6

    def count(self, name: str, handle: int | None = None) -> int:
        return self.calls[(handle, name)]

    # -------------------------------------------------------------- system

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.159.04"  # old bindings give bytes: the collector must decode

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.159.04"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    @nvml
    def nvmlDeviceGetHandleByIndex(self, handle: int) -> int:
        return handle

    # -------------------------------------------------------------- static

    @nvml
    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.gpus[handle].name

    @nvml
    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle].uuid

    @nvml
    def nvmlDeviceGetPciInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=self.gpus[handle].bus_id)

    @nvml
    def nvmlDeviceGetArchitecture(self, handle: int) -> int:
        return self.gpus[handle].architecture

    @nvml
    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return self.gpus[handle].minor_number

    @nvml
    def nvmlGpmQueryDeviceSupport(self, handle: int) -> pynvml.c_nvmlGpmSupport_t:
        return pynvml.c_nvmlGpmSupport_t(version=1, isSupportedDevice=int(self.gpus[handle].gpm))

    @nvml
    def nvmlGpmSampleAlloc(self) -> Any:
        buffer = ctypes.create_string_buffer(64)
        self._samples[ctypes.addressof(buffer)] = buffer
        return ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)

    @nvml
    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed.append(_address(sample))

    # -------------------------------------------------------------- per tick

    @nvml
    def nvmlDeviceGetUtilizationRates(self, handle: int) -> pynvml.c_nvmlUtilization_t:
        return pynvml.c_nvmlUtilization_t(gpu=97 - handle, memory=41)

    @nvml
    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        total = self.gpus[handle].memory_total
        if version is None:
            return pynvml.c_nvmlMemory_t(total=total, free=total - (1 << 30), used=1 << 30)
        return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=total - (3 << 30),
                                        used=3 << 30)

    @nvml
    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return POWER_MW

    @nvml
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return POWER_LIMIT_MW

    @nvml
    def nvmlDeviceGetTemperatureV(self, handle: int, sensor: int) -> int:
        if not self.gpus[handle].temperature_v:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return 57

    @nvml
    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 33

    @nvml
    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[clock]  # MHz

    @nvml
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return pynvml.nvmlClocksEventReasonSwPowerCap | 0x10000

    @nvml
    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        assert counter == pynvml.NVML_VOLATILE_ECC
        return ECC_TOTALS[kind]

    @nvml
    def nvmlDeviceGetFieldValues(self, handle: int, requests: list[tuple[int, int]]) -> list[Any]:
        """As nvml.h documents it: one nvmlFieldValue_t per request, each with its own nvmlReturn (an
        id the driver does not know: NVML_ERROR_INVALID_ARGUMENT); the same figures as the single calls."""
        device = self.gpus[handle]
        elapsed_s = (self.now_us - START_US) / 1e6
        nvlink_per_second = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: NVLINK_RX_KIB_PER_S,
                             pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: NVLINK_TX_KIB_PER_S}
        answers = {  # field id -> (value type, value)
            **{field_id: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 10**9 + round(per_second * elapsed_s))
               for field_id, per_second in nvlink_per_second.items()},
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, POWER_MW),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, POWER_MW),
            pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, POWER_LIMIT_MW),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                                                   ECC_TOTALS[pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED]),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                                                   ECC_TOTALS[pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED]),
        }
        unsupported = device.unsupported_fields | (set() if device.nvlink else set(nvlink_per_second))
        values = []
        for field_id, scope in requests:
            value = pynvml.c_nvmlFieldValue_t(fieldId=field_id, scopeId=scope, timestamp=self.now_us)
            if field_id not in answers:
                value.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            elif field_id in unsupported:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType, number = answers[field_id]
                if value.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                    value.value.uiVal = number
                else:
                    value.value.ullVal = number
            values.append(value)
        return values

    @nvml
    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return 6_640_625  # KB/s: 6.8e9 bytes/s

    @nvml
    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[handle].processes]

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """The C entry points the collector calls directly (not through pynvml's wrappers)."""
        if name != "nvmlDeviceGetProcessUtilization":
            raise AttributeError(f"the fake NVML has no C entry point {name}: add it to FakeNvml")
        return self._process_utilization

    def _process_utilization(self, handle: int, buffer: Any, count: Any, last_seen: ctypes.c_ulonglong) -> int:
        """nvmlDeviceGetProcessUtilization as nvml.h documents it: the caller's buffer of ``*count``
        samples; too small (or NULL) answers NVML_ERROR_INSUFFICIENT_SIZE with the count needed."""
        self.calls[(handle, "nvmlDeviceGetProcessUtilization")] += 1
        device = self.gpus[handle]
        code = device.errors_once.pop("nvmlDeviceGetProcessUtilization", None) or \
            device.errors.get("nvmlDeviceGetProcessUtilization")
        if code is not None:
            return code
        capacity = count._obj  # ctypes.byref(c_uint): the pointed-to c_uint
        # NVML answers from the given time on, that sample included
        samples = [(at, pid, sm) for at, pid, sm in device.utilization_samples if at >= last_seen.value]
        self.utilization_buffer_sizes.append(0 if buffer is None else capacity.value)
        if not samples:
            return pynvml.NVML_ERROR_NOT_FOUND
        if buffer is None or capacity.value < len(samples):
            capacity.value = len(samples)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for index, (at, pid, sm) in enumerate(samples):
            buffer[index].pid, buffer[index].timeStamp, buffer[index].smUtil = pid, at, sm
        capacity.value = len(samples)
        return pynvml.NVML_SUCCESS

    @nvml
    def nvmlGpmSampleGet(self, handle: int, sample: Any) -> Any:
        self.sampled.append((handle, _address(sample), self.now_us))
        return sample

    @nvml
    def nvmlGpmMetricsGet(self, request: pynvml.c_nvmlGpmMetricsGet_t) -> pynvml.c_nvmlGpmMetricsGet_t:
        taken = {address: at for _, address, at in self.sampled}
        older, newer = taken[_address(request.sample1)], taken[_address(request.sample2)]
        if newer <= older:  # real NVML would give garbage for a reversed window
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for index in range(request.numMetrics):
            metric = request.metrics[index]
            if metric.metricId in GPM_UNSUPPORTED:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = GPM_VALUES[metric.metricId]
        return request


def _address(sample: Any) -> int:
    address = ctypes.cast(sample, ctypes.c_void_p).value
    assert address is not None
    return address


def _copy(model: FakeGpu) -> FakeGpu:
    """A test's own GPU: what tests change of it (errors, processes, samples) stays in that test."""
    return dataclasses.replace(model, errors=dict(model.errors), errors_once=dict(model.errors_once),
                               processes=list(model.processes), utilization_samples=list(model.utilization_samples))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml_module = FakeNvml([_copy(HOPPER), _copy(AMPERE)])
    monkeypatch.setattr(gpu, "pynvml", nvml_module)
    return nvml_module


def tick(collector: gpu.GpuCollector) -> list[pb.GpuStats]:
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return list(snapshot.gpus)


def test_start_up_reads_versions_and_static_facts(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    assert collector.status().available
    info = pb.AgentInfo()
    collector.describe(info)
    assert (info.driver_version, info.nvml_version, info.cuda_driver_version) == ("580.159.04", "13.580.159.04", "13.0")
    assert [(g.index, g.name, g.uuid, g.pci_bus_id, g.architecture, g.gpm_supported, g.memory_total_bytes)
            for g in info.gpus] == [
        (0, "NVIDIA H200", "GPU-h200", "00000000:19:00.0", "Hopper", True, 141 << 30),
        (1, "NVIDIA A100-SXM4-80GB", "GPU-a100", "00000000:2A:00.0", "Ampere", False, 80 << 30),
    ]
    collector.close()
    assert fake.shut_down
    assert sorted(fake.freed) == sorted(set(fake._samples))  # both GPM buffers of the H200


def test_a_hopper_gpu_gives_readings_rates_from_two_ticks_and_gpm(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    first, ampere = tick(collector)
    assert (first.minor_number, ampere.minor_number) == (4, 0)
    assert fake.count("nvmlDeviceGetMinorNumber", 0) == 1  # static: read at start-up only
    assert (first.utilization_percent, first.memory_utilization_percent) == (97.0, 41.0)
    assert (first.memory_used_bytes, first.memory_total_bytes) == (3 << 30, 141 << 30)  # the v2 memory call
    assert (first.power_watts, first.power_limit_watts, first.temperature_celsius) == (651.25, 700.0, 57.0)
    assert (first.sm_clock_hz, first.memory_clock_hz) == (1.98e9, 3.201e9)
    assert list(first.clock_event_reasons) == ["sw_power_cap", "unknown_0x10000"]
    assert (first.ecc_corrected_total, first.ecc_uncorrected_total) == (3, 0)
    assert first.nvlink_rx_bytes_total == 10**9 * KIB
    assert first.unavailable["nvlink_rx_bytes_per_s"] == FIRST_SAMPLE
    assert {first.unavailable[field] for field in gpu.GPM_FIELDS} == {FIRST_SAMPLE}

    fake.advance(1.0)
    second = tick(collector)[0]
    assert second.nvlink_rx_bytes_per_s == NVLINK_RX_KIB_PER_S * KIB == 180e9
    assert second.nvlink_tx_bytes_per_s == NVLINK_TX_KIB_PER_S * KIB
    assert second.nvlink_rx_bytes_total == (10**9 + NVLINK_RX_KIB_PER_S) * KIB
    assert (second.sm_active_percent, second.graphics_active_percent, second.tensor_active_percent) == (87.5, 99.5, 55.5)
    assert second.pcie_tx_bytes_per_s == 2000 * MIB and second.pcie_rx_bytes_per_s == 6500 * MIB
    assert second.gpm_nvlink_rx_bytes_per_s == 170_000 * MIB
    assert second.gpm_window_seconds == 1.0
    assert second.unavailable["fp64_active_percent"] == "GPM: Not Supported"
    assert second.unavailable["dram_active_percent"] == "GPM returned NaN for this window"
    assert not second.HasField("dram_active_percent")

    fake.advance(1.0)
    tick(collector)  # the window is (tick 2, tick 3): the buffers take turns
    buffers = [address for handle, address, _ in fake.sampled if handle == 0]
    assert len(buffers) == 3 and buffers[0] == buffers[2] != buffers[1]
    assert fake.count("nvmlDeviceGetPcieThroughput", 0) == 0  # GPM gives PCIe: the 20 ms call is never made
    collector.close()


def test_processes_are_named_from_proc_and_missing_memory_has_a_reason(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    stats = tick(collector)[0]
    mine, dead = stats.processes
    assert (mine.pid, mine.name, mine.used_memory_bytes) == (os.getpid(), psutil.Process().name(), 1 << 30)
    assert (dead.pid, dead.name, dead.HasField("used_memory_bytes")) == (DEAD_PID, "", False)
    assert stats.unavailable[f"processes[{DEAD_PID}].used_memory_bytes"] == "NVML gives no per-process memory here"
    collector.close()


@pytest.mark.skipif(unavailable_reason(user_name=None) is not None, reason=str(unavailable_reason(user_name=None)))
def test_a_process_in_a_container_shows_its_pid_in_there_and_its_container(fake: FakeNvml) -> None:
    with Container.create(docker_cgroup=False) as box:  # in new namespaces, not in a container's cgroup
        inner = box.init_pid
        fake.gpus[0].processes = [(os.getpid(), 1 << 30), (inner, 1 << 30)]
        collector = gpu.GpuCollector(1.0, clock=fake.clock)
        stats = tick(collector)[0]
        collector.close()
    mine, contained = stats.processes
    assert (contained.pid, contained.pid_in_container, contained.container.own_mount_namespace) == (inner, 1, True)
    assert not mine.HasField("pid_in_container") and not mine.HasField("container")
    assert stats.unavailable[f"processes[{os.getpid()}].pid_in_container"] == containers.SAME_PID_NAMESPACE


def test_a_gpu_without_gpm_uses_the_slow_pcie_call_and_unsupported_calls_are_asked_once(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(1.0, slow_interval_seconds=30.0, clock=fake.clock)
    ticks = []
    for _ in range(3):
        ticks.append(tick(collector)[1])
        fake.advance(1.0)
    older = ticks[-1]
    assert older.unavailable["sm_active_percent"] == "GPM needs Hopper or newer (Ampere)"
    assert older.pcie_tx_bytes_per_s == 6_640_625 * KIB
    assert older.unavailable["pcie_rx_bytes_per_s"] == "NVML: Unknown Error"
    assert older.unavailable["power_limit_watts"] == "NVML: Not Supported"
    assert older.temperature_celsius == 33.0  # the unversioned call, on drivers without nvmlDeviceGetTemperatureV
    assert older.unavailable["nvlink_rx_bytes_total"] == "NVML: Not Supported"
    assert older.nvml_failed_queries == 0  # "not supported" is a fact of the GPU, not a failed sample
    # Permanent answers are asked once; the working fallbacks every tick.
    assert fake.count("nvmlDeviceGetEnforcedPowerLimit", 1) == 1
    assert fake.count("nvmlDeviceGetTemperatureV", 1) == 1
    assert fake.count("nvmlDeviceGetTemperature", 1) == 3
    # Power, ECC and the NVLink answer in one field-values call a tick: GA100's power is the instant field,
    # the limit (supported in neither form) was asked once by its own call and is not asked again.
    assert fake.count("nvmlDeviceGetFieldValues", 1) == 3
    assert older.power_watts == POWER_MW / 1000 and older.ecc_corrected_total == 3
    assert fake.count("nvmlDeviceGetPowerUsage", 1) == fake.count("nvmlDeviceGetTotalEccErrors", 1) == 0
    assert fake.count("nvmlDeviceGetPcieThroughput", 1) == 2  # tx and rx once in 30 s, not per tick
    fake.advance(30.0)
    again = tick(collector)[1]
    assert fake.count("nvmlDeviceGetPcieThroughput", 1) == 4  # a transient error is asked again later
    assert again.pcie_tx_bytes_per_s == 6_640_625 * KIB
    collector.close()


def test_a_transient_error_is_a_reason_for_one_tick_and_retried(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    tick(collector)
    fake.gpus[0].errors_once["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_GPU_IS_LOST
    fake.advance(1.0)
    failed = tick(collector)[0]
    assert not failed.HasField("utilization_percent")
    assert failed.unavailable["utilization_percent"] == failed.unavailable["memory_utilization_percent"] == "NVML: GPU is lost"
    assert failed.power_watts == 651.25  # the other readings of the tick stand
    assert failed.nvml_failed_queries == 1  # dynolog's dcgm_error: the sample is incomplete
    fake.advance(1.0)
    recovered = tick(collector)[0]
    assert recovered.utilization_percent == 97.0 and recovered.nvml_failed_queries == 0
    assert fake.count("nvmlDeviceGetUtilizationRates", 0) == 3
    collector.close()


def test_a_gpm_window_under_half_a_second_is_not_sampled(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(0.2, clock=fake.clock)
    tick(collector)
    fake.advance(0.2)
    short = tick(collector)[0]
    assert short.unavailable["sm_active_percent"] == ("GPM window under 0.5 s (interval too short): "
                                                      "0.20 s so far, measured over the next ticks")
    assert len([s for s in fake.sampled if s[0] == 0]) == 1  # no sample taken for the short window
    fake.advance(0.4)
    assert tick(collector)[0].gpm_window_seconds == pytest.approx(0.6)
    collector.close()


def test_gpm_at_500_ms_with_timer_jitter_gives_a_window_every_tick(fake: FakeNvml) -> None:
    """Windows of 0.4999 s (a timer firing early) are 0.5 s windows: none is dropped, none doubles."""
    collector = gpu.GpuCollector(0.5, clock=fake.clock)
    tick(collector)
    windows = []
    for jitter in (-0.0001, 0.0002, -0.003, 0.001, -0.0001, 0.0):
        fake.advance(0.5 + jitter)
        stats = tick(collector)[0]
        assert "sm_active_percent" not in stats.unavailable
        windows.append(stats.gpm_window_seconds)
    assert windows == pytest.approx([0.4999, 0.5002, 0.497, 0.501, 0.4999, 0.5], abs=1e-6)
    assert len([s for s in fake.sampled if s[0] == 0]) == 7  # one sample per tick
    collector.close()


@pytest.mark.parametrize(("setup", "reason"), [
    (lambda f: setattr(f, "init_error", pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "NVML: Driver Not Loaded"),
    (lambda f: f.gpus.clear(), "no NVIDIA GPU found (NVML reports 0 devices)"),
    (lambda f: f.gpus[1].errors.update(nvmlDeviceGetHandleByIndex=pynvml.NVML_ERROR_GPU_IS_LOST), "NVML: GPU is lost"),
])
def test_start_up_failures_make_the_collector_unavailable_with_nvmls_reason(fake: FakeNvml, setup: Any,
                                                                            reason: str) -> None:
    setup(fake)
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    assert (collector.status().available, collector.status().reason) == (False, reason)
    assert tick(collector) == []
    collector.close()


def test_processes_have_their_user_command_line_and_sm_share_of_the_interval(fake: FakeNvml) -> None:
    me = psutil.Process()
    fake.gpus[0].utilization_samples = [(START_US - 6_000_000, os.getpid(), 90),  # before the first interval
                                        (START_US - 500_000, os.getpid(), 40), (START_US - 200_000, os.getpid(), 60)]
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    first = tick(collector)[0]
    mine, dead = first.processes
    assert (mine.user, mine.command, mine.sm_percent) == (me.username(), " ".join(me.cmdline()), 50.0)
    assert (dead.user, dead.command, dead.HasField("sm_percent")) == ("", "", False)
    for field in ("user", "command"):
        assert first.unavailable[f"processes[{DEAD_PID}].{field}"] == gpu.NOT_VISIBLE
    assert first.unavailable[f"processes[{DEAD_PID}].sm_percent"] == gpu.NO_UTILIZATION_SAMPLE
    # The next read counts only samples newer than those already read.
    fake.gpus[0].utilization_samples.append((START_US + 800_000, os.getpid(), 20))
    fake.advance(gpu.PROCESSES_INTERVAL_SECONDS)
    assert tick(collector)[0].processes[0].sm_percent == 20.0
    fake.advance(gpu.PROCESSES_INTERVAL_SECONDS)
    idle = tick(collector)[0]
    assert not idle.processes[0].HasField("sm_percent")
    assert idle.unavailable[f"processes[{os.getpid()}].sm_percent"] == gpu.NO_UTILIZATION_SAMPLE
    assert idle.nvml_failed_queries == 0  # no sample is NVML's answer, not a failed query
    assert fake.count("nvmlDeviceGetProcessUtilization", 1) == 0  # a GPU without processes is not asked
    collector.close()


def test_per_process_utilization_is_one_driver_call_per_read_into_a_kept_buffer(fake: FakeNvml) -> None:
    capacity = gpu.UtilizationSamples.FIRST_CAPACITY
    fake.gpus[0].utilization_samples = [(START_US - 900_000 + i, os.getpid(), 30) for i in range(capacity + 6)]
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    first = tick(collector)[0]
    assert first.processes[0].sm_percent == 30.0 and first.nvml_failed_queries == 0
    # More samples than the first buffer holds: NVML says how many it has, the buffer grows, the read is retried.
    assert fake.utilization_buffer_sizes == [capacity, 2 * capacity]
    fake.gpus[0].utilization_samples.append((START_US + 500_000, os.getpid(), 10))
    fake.advance(gpu.PROCESSES_INTERVAL_SECONDS)
    assert tick(collector)[0].processes[0].sm_percent == 10.0
    assert fake.utilization_buffer_sizes == [capacity, 2 * capacity, 2 * capacity]  # one call, the buffer kept
    collector.close()


def test_a_gpu_without_per_process_utilization_says_why_and_is_asked_once(fake: FakeNvml) -> None:
    fake.gpus[0].errors["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    for _ in range(2):
        stats = tick(collector)[0]
        fake.advance(1.0)
    assert stats.processes[0].user == psutil.Process().username()
    assert stats.unavailable[f"processes[{os.getpid()}].sm_percent"] == "NVML: Not Supported"
    assert fake.count("nvmlDeviceGetProcessUtilization", 0) == 1
    collector.close()


def _calls_by_function(fake: FakeNvml) -> collections.Counter[str]:
    """What the stand-in received, per NVML function (all GPUs)."""
    total: collections.Counter[str] = collections.Counter()
    for (_, name), calls in fake.calls.items():
        total[name] += calls
    return total


def _agent_counts(collector: gpu.GpuCollector) -> dict[str, int]:
    """What the collector publishes of its own NVML calls (HostSnapshot.nvml_calls)."""
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return {entry.function: entry.calls for entry in snapshot.nvml_calls}


def test_nvml_calls_per_interval_with_processes_on_a_hopper_gpu(fake: FakeNvml) -> None:
    """Issue 29 item 4: 15 NVML calls per tick on a busy H200 before (power, its limit and the two
    ECC counts each a call; the process list and per-process utilization every tick), 9 after, and
    the two per-process calls every 5 s; the agent's own count of them is what NVML received."""
    fake.gpus[:] = [fake.gpus[0]]
    fake.gpus[0].utilization_samples = [(START_US - 500_000, os.getpid(), 40)]
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    tick(collector)
    received, published = _calls_by_function(fake), _agent_counts(collector)
    for _ in range(10):
        fake.advance(1.0)
        tick(collector)
    made = _calls_by_function(fake) - received
    assert made == {
        "nvmlDeviceGetUtilizationRates": 10, "nvmlDeviceGetMemoryInfo": 10, "nvmlDeviceGetTemperatureV": 10,
        "nvmlDeviceGetClockInfo": 20, "nvmlDeviceGetCurrentClocksEventReasons": 10, "nvmlDeviceGetFieldValues": 10,
        "nvmlGpmSampleGet": 10, "nvmlGpmMetricsGet": 10,
        "nvmlDeviceGetComputeRunningProcesses": 2, "nvmlDeviceGetProcessUtilization": 2,  # at 5 s and 10 s
    }
    assert sum(made.values()) == 94  # 150 before
    now = _agent_counts(collector)
    grown = {function: now[function] - published.get(function, 0) for function in now}
    assert {function: calls for function, calls in grown.items() if calls} == made
    collector.close()


def test_process_figures_are_repeated_with_their_age_until_the_next_read(fake: FakeNvml) -> None:
    fake.gpus[:] = [fake.gpus[0]]
    fake.gpus[0].processes = [(os.getpid(), 1 << 30)]
    fake.gpus[0].utilization_samples = [(START_US - 500_000, os.getpid(), 40)]
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    ages, pids = [], []
    for second in range(7):
        if second == 2:  # a process starts: shown from the next read on, never as if read now
            fake.gpus[0].processes.append((DEAD_PID, 1 << 20))
        (stats,) = tick(collector)
        ages.append(stats.processes_age_seconds)
        pids.append([p.pid for p in stats.processes])
        assert stats.processes_interval_seconds == gpu.PROCESSES_INTERVAL_SECONDS
        # the first read's share, repeated with it; the second read finds no newer sample
        assert stats.processes[0].HasField("sm_percent") == (second < 5)
        fake.advance(1.0)
    assert ages == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0]
    assert pids == [[os.getpid()]] * 5 + [[os.getpid(), DEAD_PID]] * 2
    assert fake.count("nvmlDeviceGetComputeRunningProcesses", 0) == 2
    collector.close()


def test_a_failed_process_read_says_why_and_is_tried_again_the_next_tick(fake: FakeNvml) -> None:
    fake.gpus[:] = [fake.gpus[0]]
    fake.gpus[0].errors_once["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_GPU_IS_LOST
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    (failed,) = tick(collector)
    assert not failed.processes and not failed.HasField("processes_age_seconds")
    assert failed.unavailable["processes"] == failed.unavailable["processes_age_seconds"] == "NVML: GPU is lost"
    fake.advance(1.0)
    (again,) = tick(collector)
    assert again.processes and again.processes_age_seconds == 0.0
    collector.close()


def test_processes_are_read_every_tick_when_the_interval_is_longer_than_theirs(fake: FakeNvml) -> None:
    collector = gpu.GpuCollector(10.0, clock=fake.clock)
    for _ in range(3):
        assert tick(collector)[0].processes_age_seconds == 0.0
        fake.advance(10.0)
    assert fake.count("nvmlDeviceGetComputeRunningProcesses", 0) == 3
    collector.close()


def test_a_driver_without_field_values_reads_each_figure_with_its_own_call(fake: FakeNvml) -> None:
    fake.gpus[:] = [fake.gpus[0]]
    fake.gpus[0].errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    for _ in range(2):
        (stats,) = tick(collector)
        fake.advance(1.0)
    assert (stats.power_watts, stats.power_limit_watts) == (POWER_MW / 1000, POWER_LIMIT_MW / 1000)
    assert (stats.ecc_corrected_total, stats.ecc_uncorrected_total) == (3, 0)
    assert stats.unavailable["nvlink_rx_bytes_total"] == "NVML: Function Not Found"
    assert fake.count("nvmlDeviceGetFieldValues", 0) == 1  # asked once
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == fake.count("nvmlDeviceGetEnforcedPowerLimit", 0) == 2
    assert stats.nvml_failed_queries == 0
    collector.close()


def test_a_field_the_driver_does_not_know_falls_back_to_the_next_field_then_to_its_own_call(fake: FakeNvml) -> None:
    fake.gpus[:] = [fake.gpus[0]]
    fake.gpus[0].unsupported_fields = frozenset({pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_INSTANT})
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    for _ in range(3):
        (stats,) = tick(collector)
        fake.advance(1.0)
    assert stats.power_watts == POWER_MW / 1000 and stats.power_limit_watts == POWER_LIMIT_MW / 1000
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == 3 and fake.count("nvmlDeviceGetEnforcedPowerLimit", 0) == 0
    assert fake.count("nvmlDeviceGetFieldValues", 0) == 3
    collector.close()


def test_a_transient_field_values_failure_is_a_reason_for_one_tick(fake: FakeNvml) -> None:
    fake.gpus[:] = [fake.gpus[0]]
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    tick(collector)
    fake.gpus[0].errors_once["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_GPU_IS_LOST
    fake.advance(1.0)
    (failed,) = tick(collector)
    assert failed.unavailable["power_watts"] == failed.unavailable["nvlink_rx_bytes_per_s"] == "NVML: GPU is lost"
    assert failed.nvml_failed_queries == 1 and fake.count("nvmlDeviceGetPowerUsage", 0) == 0
    fake.advance(1.0)
    (recovered,) = tick(collector)
    assert recovered.power_watts == POWER_MW / 1000 and recovered.nvlink_rx_bytes_per_s == NVLINK_RX_KIB_PER_S * KIB
    collector.close()


DYNO_DATA = pathlib.Path(__file__).parent.parent / "traces" / "data" / "dyno"


def dyno_request(name: str) -> bytes:
    """The JSON body the real `dyno` sent (tests/traces/data/dyno/README.md says how it was captured)."""
    return (DYNO_DATA / f"{name}.bin").read_bytes()[4:]


def test_dyno_dcgm_pause_stops_gpm_sampling_for_its_duration_and_resume_ends_it(fake: FakeNvml,
                                                                                 tmp_path: pathlib.Path) -> None:
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    rpc = DynologRpc([], Registry(), lambda uid: tmp_path / str(uid), "v", gpm=collector)
    tick(collector)
    fake.advance(1.0)
    assert tick(collector)[0].HasField("sm_active_percent")
    assert json.loads(dyno_request("dcgm-pause"))["duration_s"] == 60
    assert rpc.answer(dyno_request("dcgm-pause"), os.getuid()) == {"status": True}  # as dynolog when it paused
    samples_before = len(fake.sampled)
    fake.advance(1.0)
    hopper, ampere = tick(collector)
    reason = hopper.unavailable["sm_active_percent"]
    assert reason.startswith("GPM paused by dcgm-pause until ") and reason.endswith(" UTC")
    assert {hopper.unavailable[field] for field in gpu.GPM_FIELDS} == {reason}
    assert collector.status().available and collector.status().reason == reason
    assert hopper.power_watts == 651.25  # everything but GPM is still sampled
    assert ampere.unavailable["sm_active_percent"] == "GPM needs Hopper or newer (Ampere)"
    fake.advance(58.5)
    tick(collector)
    assert len(fake.sampled) == samples_before  # no GPM sample taken while paused
    fake.advance(1.0)  # the 60 s are over
    after = tick(collector)[0]
    assert after.unavailable["sm_active_percent"] == FIRST_SAMPLE  # a fresh window, not one spanning the pause
    assert collector.status().reason == ""
    fake.advance(1.0)
    assert tick(collector)[0].HasField("sm_active_percent")

    assert rpc.answer(dyno_request("dcgm-pause"), os.getuid()) == {"status": True}
    assert rpc.answer(dyno_request("dcgm-resume"), os.getuid()) == {"status": True}
    fake.advance(1.0)
    assert tick(collector)[0].unavailable["sm_active_percent"] == FIRST_SAMPLE  # resumed at once
    collector.close()


def test_dcgm_pause_without_a_gpm_gpu_answers_false(fake: FakeNvml, tmp_path: pathlib.Path) -> None:
    fake.gpus[:] = [fake.gpus[1]]  # the A100 only
    collector = gpu.GpuCollector(1.0, clock=fake.clock)
    rpc = DynologRpc([], Registry(), lambda uid: tmp_path / str(uid), "v", gpm=collector)
    assert rpc.answer(dyno_request("dcgm-pause"), os.getuid()) == {"status": False}  # as dynolog without DCGM
    assert rpc.answer(dyno_request("dcgm-resume"), os.getuid()) == {"status": False}
    assert collector.status().reason == ""
    collector.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user (needs root)")
def test_only_root_or_the_owner_of_a_gpu_process_may_pause_gpm(fake: FakeNvml, tmp_path: pathlib.Path) -> None:
    nobody = 65534
    sleeper = subprocess.Popen(["sleep", "30"], user=nobody)
    try:
        fake.gpus[0].processes = [(sleeper.pid, 1 << 20)]
        collector = gpu.GpuCollector(1.0, clock=fake.clock)
        rpc = DynologRpc([], Registry(), lambda uid: tmp_path / str(uid), "v", gpm=collector)
        tick(collector)
        refused = rpc.answer(dyno_request("dcgm-pause"), nobody - 1)
        assert refused is not None and refused["status"] is False
        assert "run no process on this host's GPUs" in refused["refused"]
        assert collector.status().reason == ""  # nothing paused
        assert rpc.answer(dyno_request("dcgm-pause"), nobody) == {"status": True}  # owns the GPU process
        assert collector.status().reason.startswith("GPM paused by dcgm-pause until ")
        assert rpc.answer(dyno_request("dcgm-resume"), nobody - 1)["status"] is False  # type: ignore[index]
        assert rpc.answer(dyno_request("dcgm-resume"), 0) == {"status": True}  # root may always
        assert collector.status().reason == ""
        collector.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_whose_name_and_command_are_not_utf8_keeps_the_gpu_collector_working(fake: FakeNvml) -> None:
    """A GPU process's name (comm) and argv are bytes its owner chose: undecodable ones used to raise
    UnicodeEncodeError in stats.processes.add and fail the collector every interval; control characters
    in them would reach every console's terminal."""
    weird = subprocess.Popen([sys.executable.encode(), b"-c", RENAMED, b"\xff\xfe\x1b]52;c;aGk=\x07"],
                             stdout=subprocess.PIPE)
    try:
        assert weird.stdout is not None and weird.stdout.readline() == b"ready\n"
        fake.gpus[0].processes = [(weird.pid, 1 << 20)]
        collector = gpu.GpuCollector(1.0, clock=fake.clock)
        [stats] = [s for s in tick(collector) if s.index == 0]
        (entry,) = stats.processes
        assert entry.pid == weird.pid
        assert entry.name == "n\ufffd\\x1b[2J"
        assert entry.command.endswith(" \ufffd\ufffd\\x1b]52;c;aGk=\\x07")
        assert all(ord(c) >= 0x20 for c in entry.name + entry.command)
        stats.SerializeToString()  # a proto string holds only valid UTF-8
        collector.close()
    finally:
        weird.kill()
        weird.wait(10)


# Names itself with bytes that are not UTF-8 and a clear-screen sequence (prctl PR_SET_NAME), then waits.
RENAMED = b"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"n\\xff\\x1b[2J", 0, 0, 0)
print("ready", flush=True)
time.sleep(30)
"""
