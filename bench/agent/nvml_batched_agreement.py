"""Do the agent's batched NVML figures agree with the single calls they replace? (issue 29 item 4)

Since issue 29 the GPU collector reads power, its enforced limit and the volatile ECC totals with
one ``nvmlDeviceGetFieldValues`` a tick (``FIELD_FIGURES`` in agentd/collectors/gpu.py). nvml.h says
``NVML_FI_DEV_POWER_AVERAGE`` is what ``nvmlDeviceGetPowerUsage`` answers on Ampere and newer,
``NVML_FI_DEV_POWER_CURRENT_LIMIT`` what ``nvmlDeviceGetEnforcedPowerLimit`` answers, and the
``ECC_*_VOL_TOTAL`` fields what ``nvmlDeviceGetTotalEccErrors(..., NVML_VOLATILE_ECC)`` answers. The
stand-in NVML of the tests assumes it; this checks it on a real GPU: the real collector ticks, and right
after each tick the single calls are made; a disagreement beyond the power's own drift between the two
reads is a defect of the batch, not a rounding. Run on the GPU machine, a load on GPU 0 or not:

    python3 bench/agent/nvml_batched_agreement.py [--ticks 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import pynvml  # noqa: E402

from agentd.collectors.gpu import GpuCollector  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402


def single_calls(handle: Any) -> dict[str, float]:
    ecc = pynvml.nvmlDeviceGetTotalEccErrors
    return {
        "power_watts": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "power_limit_watts": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "ecc_corrected_total": ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_total": ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/.work/nvml_batched_agreement.json"))
    args = parser.parse_args()
    collector = GpuCollector(interval_seconds=0.5)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    rows: list[dict[str, Any]] = []
    for tick in range(args.ticks):
        collector.collect()
        singles = [single_calls(handle) for handle in handles]
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        for index, stats in enumerate(snapshot.gpus):
            for name, single in singles[index].items():
                batched = getattr(stats, name) if stats.HasField(name) else None
                rows.append({"tick": tick, "gpu": index, "figure": name, "batched": batched, "single": single})
        time.sleep(0.5)
    worst: dict[str, float] = {}
    for row in rows:
        gap = abs(row["batched"] - row["single"]) if row["batched"] is not None else float("inf")
        worst[row["figure"]] = max(worst.get(row["figure"], 0.0), gap)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "worst_gap": worst}, indent=1))
    print(f"{'figure':24} worst |batched - single| over {args.ticks} ticks x {len(handles)} GPU(s)")
    for name, gap in worst.items():
        print(f"{name:24} {gap:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
