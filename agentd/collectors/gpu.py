"""NVIDIA GPU metrics through NVML (nvidia-ml-py, module ``pynvml``).

Every tick, per GPU: utilization, memory, power and limit, temperature,
SM/memory clocks, clock-event (throttle) reasons, volatile ECC counts, the minor
number (read once), how many queries failed with an error that may pass, NVLink
bytes from NVML's 64-bit counters (rates from deltas, no sleeping), and on Hopper and newer the GPM metrics: two GPM
sample buffers are used in turn, one ``nvmlGpmSampleGet`` per tick, and the
metrics are the averages over the window between the last two samples (never under
``MIN_GPM_WINDOW_SECONDS``). Every ``PROCESSES_INTERVAL_SECONDS``: compute processes with
their memory, SM share and where they run (``agentd.containers``), repeated in between with their age.

Costs and caching (figures from research/metrics.md, H200): handles, static
info and every "not supported" / "function not found" / "no permission" answer
are cached per GPU and call, so an unsupported call is made once. Power, its limit,
the ECC counts and the NVLink counters come from one ``nvmlDeviceGetFieldValues`` a tick
(``FIELD_FIGURES``; a figure whose fields the driver does not know is read with its own
call). The slow calls stay off the hot path: ``nvmlDeviceGetPcieThroughput`` (20 ms, blocking)
runs only on GPUs without GPM and only every ``slow_interval_seconds``;
per-process utilization (1.4-2.3 ms) is asked only of GPUs with compute processes, only with
the process list, with one driver call into a buffer kept per GPU (``UtilizationSamples``;
pynvml's wrapper makes two calls and a new array every time), for the samples newer than the
last one read. The calls made are counted per NVML function (``HostSnapshot.nvml_calls``).

``pause_gpm(seconds)`` (dynolog's ``dyno dcgm-pause``) stops GPM sampling for that
long, so that Nsight Compute can have the GPU's performance counters; the GPM fields
say so and ``status()``'s reason names the end of the pause. ``resume_gpm`` ends it
early. The first window after a pause starts afresh (it never spans the pause).

No driver or no GPU: ``status()`` is unavailable with NVML's error as the
reason, every other method returns nothing, and the agent runs on.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import logging
import math
import operator
import threading
import time
from datetime import datetime, UTC
from typing import Any, NamedTuple
from collections.abc import Callable

import psutil
import pynvml

from agentd import containers
from agentd.collectors.base import Collector
from agentd.collectors.readings import FIRST_SAMPLE, Unavailable, counter_rate, put, put_unavailable, scaled
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

log = logging.getLogger(__name__)

MIB = 1024 * 1024
KIB = 1024
ALL_LINKS = 0xFFFFFFFF
# GPM windows shorter than this give garbage (nvml.h: internal refresh ~100 ms).
MIN_GPM_WINDOW_SECONDS = 0.5
# Ticks are timer-driven and jitter by a few ms: a 0.4999 s window at --interval-ms 500 is
# a 0.5 s window. Shorter ticks (down to the agent's 100 ms) skip sampling until the window
# has grown past the minimum, so every interval the agent accepts gets GPM metrics.
TICK_JITTER_SECONDS = 0.05
# The process list and per-process utilization (1.4-2.3 ms a GPU on an H100 for the latter,
# bench/agent/agentd_cpu_gpu.md) are read this often, and repeated in between with their age.
PROCESSES_INTERVAL_SECONDS = 5.0

# NVML answers that will not change while the process lives: remembered per (GPU, call).
_PERMANENT_ERRORS = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
)

# (GpuStats field, GPM metric id, factor to the field's unit)
GPM_METRICS: tuple[tuple[str, int, float], ...] = (
    ("graphics_active_percent", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 1.0),
    ("sm_active_percent", pynvml.NVML_GPM_METRIC_SM_UTIL, 1.0),
    ("sm_occupancy_percent", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 1.0),
    ("tensor_active_percent", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 1.0),
    ("dram_active_percent", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 1.0),
    ("fp16_active_percent", pynvml.NVML_GPM_METRIC_FP16_UTIL, 1.0),
    ("fp32_active_percent", pynvml.NVML_GPM_METRIC_FP32_UTIL, 1.0),
    ("fp64_active_percent", pynvml.NVML_GPM_METRIC_FP64_UTIL, 1.0),
    ("pcie_tx_bytes_per_s", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, MIB),
    ("pcie_rx_bytes_per_s", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, MIB),
    ("gpm_nvlink_tx_bytes_per_s", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MIB),
    ("gpm_nvlink_rx_bytes_per_s", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MIB),
)
GPM_FIELDS = tuple(field for field, _, _ in GPM_METRICS) + ("gpm_window_seconds",)


class FieldFigure(NamedTuple):
    """A GpuStats figure NVML also answers as a field value (nvml.h's ``NVML_FI_*``), so that a tick
    asks for all of them in one ``nvmlDeviceGetFieldValues``.

    ``fields``: the field ids that hold it, best first (the first that answers is used from then
    on); ``single``: the NVML function and arguments (after the handle) that answer it where the
    driver or the GPU answers none of its fields (a field id older drivers do not know).
    """

    stats_field: str
    fields: tuple[int, ...]
    scale: float | None  # factor to the GpuStats unit; None: a count, kept whole
    single: tuple[str, tuple[int, ...]]


FIELD_FIGURES: tuple[FieldFigure, ...] = (
    # nvmlDeviceGetPowerUsage is the 1 s average on Ampere (except GA100) and newer, the
    # instantaneous power on older GPUs: the same two fields, in that order (scope 0: the GPU).
    FieldFigure("power_watts", (pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_INSTANT), 1e-3,
                ("nvmlDeviceGetPowerUsage", ())),
    FieldFigure("power_limit_watts", (pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,), 1e-3,
                ("nvmlDeviceGetEnforcedPowerLimit", ())),
    FieldFigure("ecc_corrected_total", (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,), None,
                ("nvmlDeviceGetTotalEccErrors", (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC))),
    FieldFigure("ecc_uncorrected_total", (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,), None,
                ("nvmlDeviceGetTotalEccErrors", (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))),
)
# NVLink data bytes over all links (64-bit KiB counters): asked in the same call, no single call answers them.
NVLINK_FIELDS = (("rx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
                 ("tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX))
# A field's answer that will not change on this GPU and driver (an unknown field id is INVALID_ARGUMENT).
_FIELD_MISSING = (*_PERMANENT_ERRORS, pynvml.NVML_ERROR_INVALID_ARGUMENT)

CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (pynvml.nvmlClocksEventReasonGpuIdle, "gpu_idle"),
    (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"),
    (pynvml.nvmlClocksEventReasonSwPowerCap, "sw_power_cap"),
    (pynvml.nvmlClocksEventReasonHwSlowdown, "hw_slowdown"),
    (pynvml.nvmlClocksEventReasonSyncBoost, "sync_boost"),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, "hw_thermal_slowdown"),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, "display_clock_setting"),
)
_KNOWN_CLOCK_EVENT_BITS = functools.reduce(operator.or_, (bit for bit, _ in CLOCK_EVENT_REASONS))

_ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}

_FIELD_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def nvml_reason(error: pynvml.NVMLError) -> str:
    return f"NVML: {error}"


def text(value: str | bytes) -> str:
    """NVML strings are ``str`` in current bindings and ``bytes`` in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def clock_event_reason_names(mask: int) -> list[str]:
    """Names of the set bits of a clock-event (throttle) reason mask; unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    if mask & ~_KNOWN_CLOCK_EVENT_BITS:
        names.append(f"unknown_0x{mask & ~_KNOWN_CLOCK_EVENT_BITS:x}")
    return names


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (12080) as "12.8"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def architecture_name(code: int) -> str:
    return _ARCHITECTURES.get(code, f"unknown ({code})")


def field_value(value: Any) -> int | float | Unavailable:
    """The number in a ``c_nvmlFieldValue_t``, picked by its valueType."""
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return Unavailable(nvml_reason(pynvml.NVMLError(value.nvmlReturn)))
    member = _FIELD_VALUE_MEMBERS.get(value.valueType)
    if member is None:
        return Unavailable(f"NVML field {value.fieldId}: unknown value type {value.valueType}")
    number: int | float = getattr(value.value, member)
    return number


def prepare_gpm_request(request: Any, older: Any, newer: Any) -> None:
    """Set up a ``c_nvmlGpmMetricsGet_t`` for GPM_METRICS between two samples (every call: NVML may rewrite it)."""
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1 = older
    request.sample2 = newer
    for index, (_, metric_id, _) in enumerate(GPM_METRICS):
        request.metrics[index].metricId = metric_id


def gpm_values(request: Any) -> dict[str, float | Unavailable]:
    """Each GPM metric of a filled ``c_nvmlGpmMetricsGet_t`` in our units, or why it is missing."""
    values: dict[str, float | Unavailable] = {}
    for index, (field, _, factor) in enumerate(GPM_METRICS):
        metric = request.metrics[index]
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            values[field] = Unavailable(f"GPM: {pynvml.NVMLError(metric.nvmlReturn)}")
        elif math.isnan(metric.value):
            values[field] = Unavailable("GPM returned NaN for this window")
        else:
            values[field] = metric.value * factor
    return values


class CounterReading(NamedTuple):
    """One reading of an NVML counter with NVML's own timestamp of it."""

    value: int
    timestamp_us: int


def nvml_counter_rate(previous: CounterReading | None, current: CounterReading) -> float | Unavailable:
    """Per-second rate between two counter readings, timed by NVML's timestamps (not our clock)."""
    if previous is None:
        return Unavailable(FIRST_SAMPLE)
    return counter_rate(previous.value, current.value, (current.timestamp_us - previous.timestamp_us) / 1e6)


class NvmlCalls:
    """Calls NVML, turning errors into ``Unavailable``, remembering permanent ones per (GPU, call), and
    counting the calls made per NVML function (``made``: what the agent's sampling costs in NVML calls).

    pynvml's functions are named as NVML's and counted here by that name; a reader that calls
    NVML's C entry point itself (``UtilizationSamples``) counts each of its driver calls in ``made``.
    """

    def __init__(self) -> None:
        self._permanent: dict[tuple[int, str], Unavailable] = {}
        # Per GPU, calls that failed with an error that may pass (the collector zeroes it per sample).
        self.failures: collections.Counter[int] = collections.Counter()
        self.made: collections.Counter[str] = collections.Counter()  # NVML function -> calls since start

    def __call__(self, gpu: int, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        known = self._permanent.get((gpu, name))
        if known is not None:
            return known
        if function.__name__.startswith("nvml"):
            self.made[function.__name__] += 1
        try:
            return function(*args, **kwargs)
        except pynvml.NVMLError as error:
            unavailable = Unavailable(nvml_reason(error))
            if error.value in _PERMANENT_ERRORS:
                self._permanent[(gpu, name)] = unavailable
            else:
                self.failures[gpu] += 1
            return unavailable

    def is_permanent(self, gpu: int, name: str) -> bool:
        """Whether ``name`` answered this GPU with an error that will not change (it is not asked again)."""
        return (gpu, name) in self._permanent


@dataclasses.dataclass
class _Gpm:
    """Two GPM sample buffers used in turn, and the reusable metrics request."""

    samples: list[Any]
    request: Any
    newest: int = -1           # index of the buffer holding the latest sample, -1 before the first
    newest_at: float = 0.0
    pauses_seen: int = 0       # dcgm-pauses taken into account: a window never spans one


@dataclasses.dataclass
class _FieldAsk:
    """What one GPU's field-values call still asks for one figure: its field ids not found missing, best first."""

    fields: list[int]
    missing: Unavailable | None = None  # why none of them answers, once the last one dropped out

    def answer(self, values: dict[int, Any], failures: Callable[[], None]) -> Any:
        """The best field value this tick (a ``c_nvmlFieldValue_t``), or why there is none."""
        for field_id in list(self.fields):
            value = values[field_id]
            if value.nvmlReturn == pynvml.NVML_SUCCESS:
                del self.fields[self.fields.index(field_id) + 1:]  # the worse ones are not asked again
                return value
            reason = Unavailable(nvml_reason(pynvml.NVMLError(value.nvmlReturn)))
            if value.nvmlReturn not in _FIELD_MISSING:
                failures()
                return reason
            self.fields.remove(field_id)
            self.missing = self.missing or reason
        assert self.missing is not None  # every field id dropped out, each with its reason
        return self.missing


def _field_asks() -> dict[str, _FieldAsk]:
    """A GPU's field asks before its first tick: every field of FIELD_FIGURES and NVLINK_FIELDS."""
    return ({figure.stats_field: _FieldAsk(list(figure.fields)) for figure in FIELD_FIGURES}
            | {f"nvlink_{direction}": _FieldAsk([field_id]) for direction, field_id in NVLINK_FIELDS})


@dataclasses.dataclass
class _Device:
    index: int
    handle: Any
    info: pb.GpuInfo
    gpm: _Gpm | None
    minor_number: int | Unavailable  # /dev/nvidia<N>, fixed while the driver is loaded
    nvlink: dict[str, CounterReading] = dataclasses.field(default_factory=dict)  # direction -> KiB counter
    field_asks: dict[str, _FieldAsk] = dataclasses.field(default_factory=_field_asks)
    pcie: dict[str, float | Unavailable] = dataclasses.field(default_factory=dict)
    pcie_at: float = -math.inf


class GpuCollector(Collector):
    """NVML sampler for every GPU of the host (one thread; GPM buffers are not shared)."""

    name = "gpu"

    def __init__(
        self,
        interval_seconds: float,
        slow_interval_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(interval_seconds)
        self.slow_interval_seconds = slow_interval_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._call = NvmlCalls()
        self._reason = ""
        self._initialized = False
        self._devices: list[_Device] = []
        self._stats: list[pb.GpuStats] = []
        self._made: dict[str, int] = {}  # NVML calls per function as of the latest sample
        self._processes = GpuProcesses(self._call, max(interval_seconds, PROCESSES_INTERVAL_SECONDS), clock)
        self._gpm_paused_until: float | None = None  # self._clock() time; None: not paused
        self._gpm_pause_reason = ""
        self._gpm_pauses = 0
        self.driver_version = self.nvml_version = self.cuda_driver_version = ""
        self._start()

    # ------------------------------------------------------------ set-up

    def _start(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            self._reason = nvml_reason(error)
            log.info("gpu collector unavailable", extra={"reason": self._reason})
            return
        self._initialized = True
        try:
            self.driver_version = text(pynvml.nvmlSystemGetDriverVersion())
            self.nvml_version = text(pynvml.nvmlSystemGetNVMLVersion())
            self.cuda_driver_version = cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
            self._devices = [self._open_device(index) for index in range(count)]
        except pynvml.NVMLError as error:
            self._reason = nvml_reason(error)
            self.close()
            return
        if not self._devices:
            self._reason = "no NVIDIA GPU found (NVML reports 0 devices)"

    def _open_device(self, index: int) -> _Device:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        architecture = self._call(index, "architecture", pynvml.nvmlDeviceGetArchitecture, handle)
        gpm = self._open_gpm(index, handle)
        info = pb.GpuInfo(
            index=index,
            name=text(pynvml.nvmlDeviceGetName(handle)),
            uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            memory_total_bytes=memory.total,
            architecture="" if isinstance(architecture, Unavailable) else architecture_name(architecture),
            gpm_supported=gpm is not None,
        )
        minor_number = self._call(index, "minor_number", pynvml.nvmlDeviceGetMinorNumber, handle)
        return _Device(index, handle, info, gpm, minor_number)

    def _open_gpm(self, index: int, handle: Any) -> _Gpm | None:
        support = self._call(index, "gpm_support", pynvml.nvmlGpmQueryDeviceSupport, handle)
        if isinstance(support, Unavailable) or not support.isSupportedDevice:
            return None
        samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        return _Gpm(samples, pynvml.c_nvmlGpmMetricsGet_t())

    # ------------------------------------------------------------ Collector

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(
            name=self.name, available=not self._reason, reason=self._reason or self._gpm_pause(),
            interval_seconds=self.interval_seconds
        )

    # ------------------------------------------------------------ dcgm-pause

    def has_gpm(self) -> bool:
        return any(device.gpm is not None for device in self._devices)

    def pause_gpm(self, seconds: int) -> bool:
        """Stop GPM sampling for ``seconds`` (so Nsight Compute can profile); False when no GPU has GPM."""
        if not self.has_gpm():
            return False
        until_wall = datetime.fromtimestamp(time.time() + seconds, UTC)
        with self._lock:
            self._gpm_paused_until = self._clock() + seconds
            self._gpm_pauses += 1
            self._gpm_pause_reason = f"GPM paused by dcgm-pause until {until_wall:%Y-%m-%d %H:%M:%S} UTC"
        log.info("GPM sampling paused", extra={"seconds": seconds, "until": f"{until_wall:%H:%M:%S} UTC"})
        return True

    def resume_gpm(self) -> bool:
        """End a pause now; False when no GPU has GPM."""
        if not self.has_gpm():
            return False
        with self._lock:
            was_paused, self._gpm_paused_until = self._gpm_paused_until is not None, None
        if was_paused:
            log.info("GPM sampling resumed by dcgm-resume")
        return True

    def gpu_pids(self) -> set[int]:
        """The processes on this host's GPUs at the latest sample (as NVML lists them)."""
        with self._lock:
            return {process.pid for stats in self._stats for process in stats.processes}

    def _gpm_pause(self) -> str:
        """The pause's reason while it lasts, else ""."""
        return self._gpm_pause_state()[0]

    def _gpm_pause_state(self) -> tuple[str, int]:
        """The pause's reason while it lasts (else ""), and how many pauses there were."""
        with self._lock:
            if self._gpm_paused_until is not None and self._clock() >= self._gpm_paused_until:
                self._gpm_paused_until = None
            return self._gpm_pause_reason if self._gpm_paused_until is not None else "", self._gpm_pauses

    def info(self) -> list[pb.GpuInfo]:
        """Static facts per GPU for GetInfo (empty without a driver)."""
        copies = []
        for device in self._devices:
            copy = pb.GpuInfo()
            copy.CopyFrom(device.info)
            copies.append(copy)
        return copies

    def describe(self, info: pb.AgentInfo) -> None:
        """Driver/NVML/CUDA versions and the GPU list for GetInfo (static after start-up)."""
        info.driver_version = self.driver_version
        info.nvml_version = self.nvml_version
        info.cuda_driver_version = self.cuda_driver_version
        info.gpus.extend(self.info())

    def collect(self) -> None:
        if self._reason:
            return
        stats = [self._sample(device) for device in self._devices]
        self._processes.keep_only({process.pid for gpu in stats for process in gpu.processes})
        with self._lock:
            self._stats = stats
            self._made = dict(self._call.made)

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            snapshot.gpus.extend(self._stats)
            for function, calls in sorted(self._made.items()):
                snapshot.nvml_calls.add(function=function, calls=calls)

    def close(self) -> None:
        if not self._initialized:
            return
        for device in self._devices:
            if device.gpm is not None:
                for sample in device.gpm.samples:
                    self._call(device.index, "gpm_free", pynvml.nvmlGpmSampleFree, sample)
        self._devices = []
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.warning("nvmlShutdown failed", extra={"reason": nvml_reason(error)})
        self._initialized = False

    # ------------------------------------------------------------ per tick

    def _sample(self, device: _Device) -> pb.GpuStats:
        index, handle, call = device.index, device.handle, self._call
        info = device.info
        stats = pb.GpuStats(index=index, name=info.name, uuid=info.uuid, pci_bus_id=info.pci_bus_id)
        put(stats, "minor_number", device.minor_number)
        call.failures[index] = 0

        rates = call(index, "utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        put(stats, "utilization_percent", rates if isinstance(rates, Unavailable) else float(rates.gpu))
        put(stats, "memory_utilization_percent", rates if isinstance(rates, Unavailable) else float(rates.memory))

        memory = call(index, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle, version=pynvml.nvmlMemory_v2)
        if isinstance(memory, Unavailable):
            memory = call(index, "memory_v1", pynvml.nvmlDeviceGetMemoryInfo, handle)
        put(stats, "memory_used_bytes", memory if isinstance(memory, Unavailable) else memory.used)
        put(stats, "memory_total_bytes", memory if isinstance(memory, Unavailable) else memory.total)

        self._field_values(device, stats)
        put(stats, "temperature_celsius", scaled(self._temperature(device), 1.0))
        sm = call(index, "sm_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
        put(stats, "sm_clock_hz", scaled(sm, 1e6))
        mem = call(index, "memory_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        put(stats, "memory_clock_hz", scaled(mem, 1e6))

        mask = call(index, "clock_events", pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        put(stats, "clock_event_reasons_mask", mask)
        if not isinstance(mask, Unavailable):
            stats.clock_event_reasons.extend(clock_event_reason_names(mask))

        paused, pauses = self._gpm_pause_state()
        if device.gpm is not None and device.gpm.pauses_seen != pauses:
            device.gpm.newest, device.gpm.pauses_seen = -1, pauses  # the window after a pause starts afresh
        if device.gpm is not None and paused:
            put_unavailable(stats, GPM_FIELDS, paused)
        elif device.gpm is not None:
            self._gpm(device, device.gpm, stats)
        else:
            put_unavailable(stats, (field for field in GPM_FIELDS if not field.startswith("pcie_")),
                            f"GPM needs Hopper or newer ({info.architecture or 'unknown'})")
            self._pcie_fallback(device, stats)
        self._processes.fill(device.index, device.handle, stats)
        stats.nvml_failed_queries = call.failures[index]
        return stats

    def _temperature(self, device: _Device) -> int | Unavailable:
        value: int | Unavailable = self._call(
            device.index, "temperature_v", pynvml.nvmlDeviceGetTemperatureV, device.handle, pynvml.NVML_TEMPERATURE_GPU
        )
        if isinstance(value, Unavailable):  # drivers older than the versioned call
            value = self._call(
                device.index, "temperature", pynvml.nvmlDeviceGetTemperature, device.handle, pynvml.NVML_TEMPERATURE_GPU
            )
        return value

    def _field_values(self, device: _Device, stats: pb.GpuStats) -> None:
        """FIELD_FIGURES and the NVLink counters from one ``nvmlDeviceGetFieldValues``; a figure none of
        whose fields this GPU answers is read with its own call from then on."""
        answers = self._ask_fields(device)
        for figure in FIELD_FIGURES:
            value = answers[figure.stats_field]
            if not device.field_asks[figure.stats_field].fields:
                function, args = figure.single
                value = self._call(device.index, figure.stats_field, getattr(pynvml, function), device.handle, *args)
            elif not isinstance(value, Unavailable):
                value = field_value(value)
            put(stats, figure.stats_field, value if figure.scale is None else scaled(value, figure.scale))
        for direction, _ in NVLINK_FIELDS:
            self._nvlink(device, stats, direction, answers[f"nvlink_{direction}"])

    def _ask_fields(self, device: _Device) -> dict[str, Any]:
        """Every figure's field ids still asked, in one call: per figure its best field value this tick
        (a ``c_nvmlFieldValue_t``), or why there is none."""
        index, asks = device.index, device.field_asks
        asked = [(name, field_id) for name, ask in asks.items() for field_id in ask.fields]
        values: dict[str, dict[int, Any]] = {name: {} for name in asks}
        if asked:
            scopes = [(field_id, ALL_LINKS if name.startswith("nvlink_") else 0) for name, field_id in asked]
            answered = self._call(index, "field_values", pynvml.nvmlDeviceGetFieldValues, device.handle, scopes)
            if isinstance(answered, Unavailable):
                if self._call.is_permanent(index, "field_values"):
                    for ask in asks.values():  # no field values on this driver: every figure from its own call
                        ask.fields, ask.missing = [], answered
                return dict.fromkeys(asks, answered)
            for (name, field_id), value in zip(asked, answered, strict=True):
                values[name][field_id] = value

        def failed() -> None:
            self._call.failures[index] += 1

        return {name: ask.answer(values[name], failed) for name, ask in asks.items()}

    def _nvlink(self, device: _Device, stats: pb.GpuStats, direction: str, value: Any) -> None:
        """NVLink data bytes over all links from a 64-bit KiB counter's field value; its rate from deltas."""
        total_field, rate_field = f"nvlink_{direction}_bytes_total", f"nvlink_{direction}_bytes_per_s"
        kib = value if isinstance(value, Unavailable) else field_value(value)
        if isinstance(kib, Unavailable):
            put(stats, total_field, kib)
            put(stats, rate_field, kib)
            return
        current = CounterReading(int(kib), int(value.timestamp))
        rate = nvml_counter_rate(device.nvlink.get(direction), current)
        device.nvlink[direction] = current
        put(stats, total_field, current.value * KIB)
        put(stats, rate_field, rate if isinstance(rate, Unavailable) else rate * KIB)

    def _gpm(self, device: _Device, gpm: _Gpm, stats: pb.GpuStats) -> None:
        """Take this tick's GPM sample into the other buffer; metrics over (previous, this)."""
        now = self._clock()
        if gpm.newest >= 0 and now - gpm.newest_at < MIN_GPM_WINDOW_SECONDS - TICK_JITTER_SECONDS:
            put_unavailable(stats, GPM_FIELDS, f"GPM window under {MIN_GPM_WINDOW_SECONDS} s (interval too short): "
                                               f"{now - gpm.newest_at:.2f} s so far, measured over the next ticks")
            return
        target = 1 - gpm.newest if gpm.newest >= 0 else 0
        taken = self._call(device.index, "gpm_sample", pynvml.nvmlGpmSampleGet, device.handle, gpm.samples[target])
        if isinstance(taken, Unavailable):
            put_unavailable(stats, GPM_FIELDS, taken.reason)
            return
        previous, previous_at = gpm.newest, gpm.newest_at
        gpm.newest, gpm.newest_at = target, now
        if previous < 0:
            put_unavailable(stats, GPM_FIELDS, FIRST_SAMPLE)
            return
        prepare_gpm_request(gpm.request, gpm.samples[previous], gpm.samples[target])
        result = self._call(device.index, "gpm_metrics", pynvml.nvmlGpmMetricsGet, gpm.request)
        if isinstance(result, Unavailable):
            put_unavailable(stats, GPM_FIELDS, result.reason)
            return
        for field, value in gpm_values(result).items():
            put(stats, field, value)
        stats.gpm_window_seconds = now - previous_at

    def _pcie_fallback(self, device: _Device, stats: pb.GpuStats) -> None:
        """Without GPM: NVML's 20 ms PCIe point sample (it blocks), refreshed only every slow interval."""
        now = self._clock()
        if now - device.pcie_at >= self.slow_interval_seconds:
            device.pcie_at = now
            for field, counter in (
                ("pcie_tx_bytes_per_s", pynvml.NVML_PCIE_UTIL_TX_BYTES),
                ("pcie_rx_bytes_per_s", pynvml.NVML_PCIE_UTIL_RX_BYTES),
            ):
                kb_per_s = self._call(device.index, field, pynvml.nvmlDeviceGetPcieThroughput, device.handle, counter)
                device.pcie[field] = scaled(kb_per_s, KIB)
        for field, value in device.pcie.items():
            put(stats, field, value)


# ---------------------------------------------------------------- processes

NOT_VISIBLE = "not visible to the agent (another PID namespace, or the process ended)"
PERMISSION_DENIED = "permission denied (the agent is not root)"
NO_UTILIZATION_SAMPLE = "NVML gave no utilization sample of this process in the interval"


class ProcessFacts(NamedTuple):
    """What /proc says about a GPU process (read once while it uses a GPU)."""

    name: str
    user: str | Unavailable
    command: str | Unavailable
    uid: int | Unavailable
    pid_in_container: int | Unavailable  # NVML's pids are the host's; this one is what the process sees
    container: pb.Container | None  # where it runs (agentd.containers), None outside containers and jobs
    start_time_unix_seconds: float | Unavailable  # when the kernel started it


def process_facts(pid: int) -> ProcessFacts:
    """Name, owner and command line of ``pid``; why not, for what cannot be read."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            name = process.name()
            started: float | Unavailable = process.create_time()
            uid: int | Unavailable = process.uids().real
            user: str | Unavailable = process.username()
            try:
                arguments = process.cmdline()
                command: str | Unavailable = " ".join(arguments) if arguments else Unavailable(
                    "no command line (a kernel thread, or a zombie)")
            except psutil.AccessDenied:
                command = Unavailable("command line: permission denied (the agent is not root)")
    except psutil.NoSuchProcess:
        hidden = Unavailable(NOT_VISIBLE)
        return ProcessFacts("", hidden, hidden, hidden, hidden, None, hidden)
    except psutil.AccessDenied:
        denied = Unavailable(PERMISSION_DENIED)
        return ProcessFacts("", denied, denied, denied, denied, None, denied)
    return ProcessFacts(printable(name), printable(user) if isinstance(user, str) else user,
                        printable(command) if isinstance(command, str) else command, uid,
                        containers.pid_in_container(pid), containers.container_of(pid), started)


class ProcessUsage(NamedTuple):
    """What ``top`` shows of a GPU process at one read of the processes."""

    at: float  # the collector's clock
    cpu_seconds: float  # user and system time since it started
    cpu_percent: float | Unavailable  # CPU time per wall time since the read before, in % of one CPU
    resident_memory_bytes: int


def process_usage(pid: int, now: float, before: ProcessUsage | None) -> ProcessUsage | Unavailable:
    """``pid``'s CPU time and resident memory now, its CPU use since ``before`` (its previous read)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            times, resident = process.cpu_times(), process.memory_info().rss
    except psutil.NoSuchProcess:
        return Unavailable(NOT_VISIBLE)
    except psutil.AccessDenied:
        return Unavailable(PERMISSION_DENIED)
    cpu_seconds = times.user + times.system
    rate = counter_rate(None if before is None else before.cpu_seconds, cpu_seconds,
                        0.0 if before is None else now - before.at)
    return ProcessUsage(now, cpu_seconds, scaled(rate, 100.0), resident)


class UtilizationSamples:
    """One GPU's per-process utilization samples (``nvmlDeviceGetProcessUtilization``), one driver call a read.

    NVML fills a caller's buffer, the caller saying how many samples it holds; a buffer
    too small is answered NVML_ERROR_INSUFFICIENT_SIZE with the count needed. pynvml
    asks that count first (a call with no buffer) on every read; this keeps its buffer
    between reads and grows it only when NVML says so.
    """

    FIRST_CAPACITY = 256  # samples (8 KiB); grown when NVML answers that it has more
    MAX_CALLS = 3  # the first call, and a retry after each growth (processes may start in between)
    FUNCTION = "nvmlDeviceGetProcessUtilization"

    def __init__(self, made: collections.Counter[str]) -> None:
        self._buffer = (pynvml.c_nvmlProcessUtilizationSample_t * self.FIRST_CAPACITY)()
        self._made = made  # NvmlCalls.made: each driver call counts

    def read(self, handle: Any, since_us: int) -> list[Any]:
        """The samples newer than ``since_us`` (NVML's clock); none is an answer, not an error."""
        function = pynvml._nvmlGetFunctionPointer(self.FUNCTION)
        for _ in range(self.MAX_CALLS):
            count = ctypes.c_uint(len(self._buffer))
            self._made[self.FUNCTION] += 1
            code = function(handle, self._buffer, ctypes.byref(count), ctypes.c_ulonglong(since_us))
            if code != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            self._buffer = (pynvml.c_nvmlProcessUtilizationSample_t * max(count.value, 2 * len(self._buffer)))()
        if code == pynvml.NVML_ERROR_NOT_FOUND:
            return []
        if code != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(code)
        samples: list[Any] = self._buffer[:count.value]
        return samples


class _ProcessesRead(NamedTuple):
    """One read of a GPU's processes: when, and the entries and reasons it put into a GpuStats."""

    at: float  # the collector's clock
    stats: pb.GpuStats  # only processes and unavailable set


class GpuProcesses:
    """Each GPU's compute processes: pid, name, user, command line, where it runs (container, pod,
    SLURM job, its pid in there), GPU memory and SM share, and what ``top`` and nvitop show of it:
    CPU use since the read before, resident memory, start time.

    They are read every ``interval_seconds`` (NVML's per-process calls cost milliseconds a GPU)
    and repeated in the ticks between with their age (``GpuStats.processes_age_seconds``), so a
    figure is never shown fresher than it is. A read that fails is tried again the next tick.
    The SM share is the mean of NVML's utilization samples of the process over the last
    ``interval_seconds``, read from the newest sample seen before (NVML's own clock), so every
    sample counts once; the first read keeps only the last interval's.
    """

    def __init__(self, call: NvmlCalls, interval_seconds: float, clock: Callable[[], float]) -> None:
        self._call = call
        self.interval_seconds = interval_seconds
        self._interval_us = round(interval_seconds * 1e6)
        self._clock = clock
        self._facts: dict[int, ProcessFacts] = {}
        self._usage: dict[int, ProcessUsage] = {}  # pid -> its latest read (a process on several GPUs is read once)
        self._newest_sample_us: dict[int, int] = {}  # GPU index -> newest utilization sample read
        self._samples: dict[int, UtilizationSamples] = {}  # GPU index -> its reader
        self._reads: dict[int, _ProcessesRead] = {}  # GPU index -> its latest successful read

    def fill(self, gpu: int, handle: Any, stats: pb.GpuStats) -> None:
        now = self._clock()
        read = self._reads.get(gpu)
        if read is None or now - read.at >= self.interval_seconds - TICK_JITTER_SECONDS:
            read = _ProcessesRead(now, self._read(gpu, handle, now))
            if "processes" in read.stats.unavailable:
                self._reads.pop(gpu, None)
            else:
                self._reads[gpu] = read
        stats.processes.extend(read.stats.processes)
        stats.unavailable.update(read.stats.unavailable)
        stats.processes_interval_seconds = self.interval_seconds
        if "processes" not in read.stats.unavailable:
            stats.processes_age_seconds = now - read.at

    def _read(self, gpu: int, handle: Any, now: float) -> pb.GpuStats:
        """The GPU's processes now, as entries and reasons of a GpuStats of their own."""
        read = pb.GpuStats()
        processes = self._call(gpu, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if isinstance(processes, Unavailable):
            put_unavailable(read, ("processes", "processes_age_seconds"), processes.reason)
            return read
        shares = self._sm_shares(gpu, handle) if processes else {}
        for process in processes:
            share = shares if isinstance(shares, Unavailable) else shares.get(process.pid, Unavailable(NO_UTILIZATION_SAMPLE))
            self._add(read, process, share, self._usage_now(process.pid, now))
        return read

    def _usage_now(self, pid: int, now: float) -> ProcessUsage | Unavailable:
        """``pid``'s usage read now, or a moment ago for another GPU of this tick."""
        before = self._usage.get(pid)
        if before is not None and now - before.at < TICK_JITTER_SECONDS:
            return before
        usage = process_usage(pid, now, before)
        if isinstance(usage, Unavailable):
            self._usage.pop(pid, None)
        else:
            self._usage[pid] = usage
        return usage

    def _add(self, stats: pb.GpuStats, process: Any, sm_share: float | Unavailable,
             usage: ProcessUsage | Unavailable) -> None:
        """One process entry; each reading it lacks goes into the GPU's unavailable map, with its reason."""
        pid = process.pid
        facts = self._facts.get(pid)
        if facts is None:
            facts = self._facts[pid] = process_facts(pid)
        entry = stats.processes.add(pid=pid, name=facts.name)
        if facts.container is not None:
            entry.container.CopyFrom(facts.container)
        memory = process.usedGpuMemory
        readings = {
            "user": facts.user, "command": facts.command, "uid": facts.uid, "sm_percent": sm_share,
            "pid_in_container": facts.pid_in_container,
            "used_memory_bytes": Unavailable("NVML gives no per-process memory here") if memory is None else memory,
            "cpu_percent": usage if isinstance(usage, Unavailable) else usage.cpu_percent,
            "resident_memory_bytes": usage if isinstance(usage, Unavailable) else usage.resident_memory_bytes,
            "start_time_unix_seconds": facts.start_time_unix_seconds,
        }
        for field, value in readings.items():
            if isinstance(value, Unavailable):
                stats.unavailable[f"processes[{pid}].{field}"] = value.reason
            else:
                setattr(entry, field, value)

    def _sm_shares(self, gpu: int, handle: Any) -> dict[int, float] | Unavailable:
        """pid -> mean SM utilization (%) of its samples in the last interval."""
        since = self._newest_sample_us.get(gpu, 0)
        reader = self._samples.get(gpu)
        if reader is None:
            reader = self._samples[gpu] = UtilizationSamples(self._call.made)
        samples = self._call(gpu, "process_utilization", reader.read, handle, since)
        if isinstance(samples, Unavailable):
            return samples
        # NVML may repeat the sample at ``since`` and, rarely, report garbage over 100 %.
        fresh = [s for s in samples if s.timeStamp > since and 0 <= s.smUtil <= 100]
        if not fresh:
            return {}
        newest = max(s.timeStamp for s in fresh)
        self._newest_sample_us[gpu] = newest
        per_pid: dict[int, list[float]] = collections.defaultdict(list)
        for sample in fresh:
            if sample.timeStamp > newest - self._interval_us:
                per_pid[sample.pid].append(float(sample.smUtil))
        return {pid: sum(values) / len(values) for pid, values in per_pid.items()}

    def keep_only(self, pids: set[int]) -> None:
        """Forget what was read of processes no longer on any GPU (their pids may be reused)."""
        self._facts = {pid: facts for pid, facts in self._facts.items() if pid in pids}
        self._usage = {pid: usage for pid, usage in self._usage.items() if pid in pids}
