"""What each NVML call the agent's GPU collector makes per tick costs, alone (issue 14's CPU goal).

On the GPU machine, GPU 0, a light load beside it or not: each call made REPS times in a row,
mean and minimum wall µs per call (time.perf_counter around each call; the thread's CPU time
over all REPS as well, since NVML may wait rather than work). ``nvmlGpmMetricsGet`` is timed with
1, 2, 4, 8 and all 12 of the agent's metrics between the same two samples, to see whether its
cost grows with the metric count. The per-process utilization read is also timed as nvitop makes
it (pynvml's two-call wrapper, the samples of the last second). Prints one JSON document.

    python3 bench/console/nvml_call_cost.py [--reps 200] [--with-load]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml  # noqa: E402

from agentd.collectors.gpu import FIELD_FIGURES, GPM_METRICS, UtilizationSamples  # noqa: E402


def timed(function: Callable[..., Any], *args: Any, reps: int, **kwargs: Any) -> dict[str, float | str]:
    walls = []
    cpu_start = time.thread_time()
    try:
        for _ in range(reps):
            start = time.perf_counter()
            function(*args, **kwargs)
            walls.append(time.perf_counter() - start)
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    cpu = time.thread_time() - cpu_start
    return {"mean_us": 1e6 * sum(walls) / reps, "min_us": 1e6 * min(walls), "cpu_us": 1e6 * cpu / reps}


def gpm_metrics_get(count: int, older: Any, newer: Any) -> Callable[[], Any]:
    """nvmlGpmMetricsGet of the agent's first ``count`` metrics, the request set up before each
    call as the agent does (NVML may rewrite it)."""
    request = pynvml.c_nvmlGpmMetricsGet_t()

    def call() -> Any:
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = count
        request.sample1, request.sample2 = older, newer
        for index, (_, metric_id, _) in enumerate(GPM_METRICS[:count]):
            request.metrics[index].metricId = metric_id
        return pynvml.nvmlGpmMetricsGet(request)
    return call


LOAD = ("import torch, time\n"
        "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
        "print('loaded', flush=True)\n"
        "while True:\n"
        "    for _ in range(8): a @ a\n"
        "    torch.cuda.synchronize(); time.sleep(0.05)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--with-load", action="store_true",
                        help="a PyTorch process runs matmuls on GPU 0 meanwhile (per-process calls have one to report)")
    args = parser.parse_args()
    load = None
    if args.with_load:
        load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
        assert load.stdout is not None and load.stdout.readline().strip() == "loaded"
        time.sleep(2)  # NVML has utilization samples of it by now
    try:
        measure(args.reps)
    finally:
        if load is not None:
            load.kill()


def measure(reps: int) -> None:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
              (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)]
    calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
        "utilization": (pynvml.nvmlDeviceGetUtilizationRates, (handle,), {}),
        "memory_v2": (pynvml.nvmlDeviceGetMemoryInfo, (handle,), {"version": pynvml.nvmlMemory_v2}),
        "power": (pynvml.nvmlDeviceGetPowerUsage, (handle,), {}),
        "power_limit": (pynvml.nvmlDeviceGetEnforcedPowerLimit, (handle,), {}),
        "temperature_v": (pynvml.nvmlDeviceGetTemperatureV, (handle, pynvml.NVML_TEMPERATURE_GPU), {}),
        "sm_clock": (pynvml.nvmlDeviceGetClockInfo, (handle, pynvml.NVML_CLOCK_SM), {}),
        "memory_clock": (pynvml.nvmlDeviceGetClockInfo, (handle, pynvml.NVML_CLOCK_MEM), {}),
        "clock_events": (pynvml.nvmlDeviceGetCurrentClocksEventReasons, (handle,), {}),
        "ecc_corrected": (pynvml.nvmlDeviceGetTotalEccErrors,
                          (handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC), {}),
        "nvlink_fields": (pynvml.nvmlDeviceGetFieldValues, (handle, fields), {}),
        # the agent's tick since issue 29: power (average, instant), its limit, ECC and NVLink in one call
        "batched_fields": (pynvml.nvmlDeviceGetFieldValues, (handle, fields + [
            (field_id, 0) for figure in FIELD_FIGURES for field_id in figure.fields]), {}),
        "compute_processes": (pynvml.nvmlDeviceGetComputeRunningProcesses, (handle,), {}),
        "process_utilization": (UtilizationSamples(collections.Counter()).read, (handle, 0), {}),
    }
    result: dict[str, Any] = {"gpu": pynvml.nvmlDeviceGetName(handle), "reps": reps,
                              "driver": pynvml.nvmlSystemGetDriverVersion(),
                              "calls": {name: timed(f, *a, reps=reps, **kw) for name, (f, a, kw) in calls.items()}}
    # as the agent asks from its second tick on: only samples newer than the newest it has seen
    reader = UtilizationSamples(collections.Counter())
    newest = max((sample.timeStamp for sample in reader.read(handle, 0)), default=0)
    result["calls"]["process_utilization_since_newest"] = timed(reader.read, handle, newest, reps=reps)
    result["calls"]["process_utilization_since_newest"]["newest_us"] = newest
    # as nvitop asks (pynvml's wrapper: a call without a buffer for the count, then the read), for
    # the samples of the last second
    result["calls"]["process_utilization_pynvml_last_second"] = timed(
        lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, time.time_ns() // 1000 - 1_000_000), reps=reps)
    if hasattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo"):  # NVML 12.4+: the versioned call
        result["calls"]["processes_utilization_info_since_newest"] = timed(
            pynvml.nvmlDeviceGetProcessesUtilizationInfo, handle, newest, reps=reps)
    result["gpu_processes"] = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    result["calls"]["gpm_sample_get"] = timed(pynvml.nvmlGpmSampleGet, handle, samples[0], reps=reps)
    time.sleep(1.0)
    pynvml.nvmlGpmSampleGet(handle, samples[1])
    result["gpm_metrics_get"] = {
        str(count): timed(gpm_metrics_get(count, *samples), reps=reps)
        for count in (1, 2, 4, 8, len(GPM_METRICS))}
    for sample in samples:
        pynvml.nvmlGpmSampleFree(sample)
    pynvml.nvmlShutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
