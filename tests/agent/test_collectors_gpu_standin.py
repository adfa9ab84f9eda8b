"""The GPU collector through the real nvidia-ml-py bindings against the stand-in libnvidia-ml.so.1
(bench/console/fake_nvml.c, compiled here): the field-values batch as NVML lays it out in C, the
process list every 5 s with its age, and the agent's count of its own NVML calls.

The collector runs in a child process (pynvml loads the library once per process), on a clock the
child advances by one second a tick, so the 5 s process cadence takes no waiting.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TICKS = 7
CHILD = f"""
import json
from agentd.collectors import gpu
from agentd.proto import tuiprof_agent_pb2 as pb

now = [1000.0]
collector = gpu.GpuCollector(1.0, clock=lambda: now[0])
ticks = []
for _ in range({TICKS}):
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    (stats,) = snapshot.gpus
    ticks.append({{
        "power": stats.power_watts, "limit": stats.power_limit_watts,
        "ecc": [stats.ecc_corrected_total, stats.ecc_uncorrected_total],
        "nvlink_rx_total": stats.nvlink_rx_bytes_total, "age": stats.processes_age_seconds,
        "pids": [process.pid for process in stats.processes], "unavailable": dict(stats.unavailable),
        "calls": {{entry.function: entry.calls for entry in snapshot.nvml_calls}},
    }})
    now[0] += 1.0
collector.close()
print(json.dumps(ticks))
"""


@pytest.fixture(scope="module")
def standin_nvml(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (build-essential) for the stand-in NVML")
    folder = tmp_path_factory.mktemp("nvml")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(folder / "libnvidia-ml.so.1"),
                    str(REPO / "bench" / "console" / "fake_nvml.c")], check=True)
    return folder


def test_field_values_processes_every_5_s_and_the_agents_nvml_calls(standin_nvml: pathlib.Path) -> None:
    env = os.environ | {"LD_LIBRARY_PATH": str(standin_nvml), "FAKE_NVML_PIDS": str(os.getpid())}
    child = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == 0, child.stderr
    ticks = json.loads(child.stdout)
    for tick in ticks:
        assert 150 <= tick["power"] <= 300 and tick["limit"] == 700.0 and tick["ecc"] == [0, 0], tick
        assert tick["nvlink_rx_total"] > 0 and tick["pids"] == [os.getpid()]
        assert not {"power_watts", "power_limit_watts", "ecc_corrected_total"} & set(tick["unavailable"])
    assert [tick["age"] for tick in ticks] == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0]
    calls = ticks[-1]["calls"]
    assert calls["nvmlDeviceGetFieldValues"] == TICKS
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == calls["nvmlDeviceGetProcessUtilization"] == 2
    assert {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEccErrors"}.isdisjoint(calls)
