#!/usr/bin/env bash
# One device call on nvidia-h200 (one GPU), carry [".whl"] (msgspec, grpcio, protobuf, setuptools, cython,
# py-spy wheels for Python 3.12): the figures issue 29 item 4 and issue 30 item 1 owe that one GPU can give.
#   OUT=$OUT bash bench/gpu/single_gpu_round.sh
# 1. NVML per-call costs under load (bench/console/nvml_call_cost.py, batched_fields included);
# 2. the agent's batched field values against the single calls (bench/agent/nvml_batched_agreement.py);
# 3. agentd's CPU, RSS/PSS and NVML calls per second with the GPU idle, then busy (bench/agent/agentd_cpu_gpu.py);
# 4. the cost of timing named Python functions, per call and per GPU training step (bench/native/function_timing_cost.py).
set -u
. bench/gpu/device_env.sh bench/.work/single_gpu_round
export PATH=/tmp/site/bin:$PATH
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; echo "cpus $(nproc)"
python3 -c 'import sys, torch, pynvml; print("python", sys.version.split()[0], "torch", torch.__version__, "nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "?")'
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
LOAD='import time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
while True:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.02)'
echo "== 1 nvml call cost"; python3 bench/console/nvml_call_cost.py --with-load > "$OUT/nvml_call_cost.json"; head -c 3000 "$OUT/nvml_call_cost.json"
echo "== 3a agentd idle GPU"; python3 bench/agent/agentd_cpu_gpu.py --out /tmp/agent_idle --seconds 45 --warmup 15 --profile-seconds 20 > /dev/null && cp /tmp/agent_idle/result.json "$OUT/agentd_idle.json"
python3 -c "$LOAD" & LOADPID=$!
sleep 5
echo "== 2 batched agreement (busy)"; python3 bench/agent/nvml_batched_agreement.py --ticks 20 --out "$OUT/nvml_batched_agreement.json"
echo "== 3b agentd busy GPU"; python3 bench/agent/agentd_cpu_gpu.py --out /tmp/agent_busy --seconds 60 --warmup 15 --profile-seconds 40 > /dev/null && cp /tmp/agent_busy/result.json "$OUT/agentd_busy.json"
kill $LOADPID
python3 - <<'PY'
import json, os
for name in ("agentd_idle", "agentd_busy"):
    r = json.load(open(os.path.join(os.environ["OUT"], name + ".json")))
    print(name, "cpu ms/s", r["agent_cpu_ms_per_s"], "memory", r["memory_kib"], "collectors", r["collector_cpu_ms_per_s"])
    print("  nvml calls/s", r["nvml_calls_per_s"])
PY
echo "== 4 function timing"; python3 bench/native/function_timing_cost.py --device cuda --out "$OUT/function_timing_cost.json"
