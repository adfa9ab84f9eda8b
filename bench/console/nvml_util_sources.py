"""Two NVML sources of a GPU's busy share over one interval, side by side, with one process on the GPU
(issue 14: the per-process read costs 1.4 ms a call on an H100 VM; is the device's own sample
buffer a cheaper source of the same figure when the GPU has one process?).

Every second for --seconds, on GPU 0 while a PyTorch process runs matmul bursts on it:
- the process's SM share: the mean ``smUtil`` of its ``nvmlDeviceGetProcessUtilization`` samples
  newer than the last read (what the agent reports as the process's SM share);
- the device's: the mean of ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` newer than the
  last read;
- ``nvmlDeviceGetUtilizationRates().gpu`` (NVML's own last sample period);
with each call's CPU time. Prints one JSON document: the per-second triples, and the calls' mean
CPU µs.

    python3 bench/console/nvml_util_sources.py [--seconds 30]
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

from agentd.collectors.gpu import UtilizationSamples  # noqa: E402

LOAD = ("import torch, time\n"
        "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
        "print('loaded', flush=True)\n"
        "while True:\n"
        "    for _ in range(30): a @ a\n"
        "    torch.cuda.synchronize(); time.sleep(0.1)\n")


def timed(function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.thread_time()
    result = function(*args)
    return result, (time.thread_time() - start) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None and load.stdout.readline().strip() == "loaded"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        time.sleep(2)
        reader = UtilizationSamples(collections.Counter())
        process_seen = max((s.timeStamp for s in reader.read(handle, 0)), default=0)
        _, device = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        device_seen = max((s.timeStamp for s in device), default=0)
        rows: list[dict[str, Any]] = []
        costs: dict[str, list[float]] = {"process": [], "device_samples": [], "rates": []}
        for _ in range(args.seconds):
            time.sleep(1.0)
            samples, cost = timed(reader.read, handle, process_seen)
            costs["process"].append(cost)
            mine = [s for s in samples if s.pid == load.pid and s.timeStamp > process_seen]
            process_seen = max([process_seen, *(s.timeStamp for s in samples)])
            (_, device), cost = timed(pynvml.nvmlDeviceGetSamples, handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                      device_seen)
            costs["device_samples"].append(cost)
            fresh = [s for s in device if s.timeStamp > device_seen]
            device_seen = max([device_seen, *(s.timeStamp for s in device)])
            rates, cost = timed(pynvml.nvmlDeviceGetUtilizationRates, handle)
            costs["rates"].append(cost)
            rows.append({
                "process_sm_share": round(sum(s.smUtil for s in mine) / len(mine), 1) if mine else None,
                "process_samples": len(mine),
                "device_samples_mean": round(sum(s.sampleValue.uiVal for s in fresh) / len(fresh), 1)
                if fresh else None,
                "device_samples": len(fresh),
                "utilization_rates_gpu": rates.gpu,
            })
        print(json.dumps({"gpu": pynvml.nvmlDeviceGetName(handle),
                          "processes": len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
                          "cpu_us_per_call": {k: round(sum(v) / len(v), 1) for k, v in costs.items()},
                          "per_second": rows}, indent=1))
    finally:
        load.kill()


if __name__ == "__main__":
    main()
