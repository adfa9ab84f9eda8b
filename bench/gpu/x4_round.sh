#!/usr/bin/env bash
# The 4-GPU figures issues 27 and 29 owe (RANKS=2 runs the first two on nvidia-h200-x2), in three device calls on one warm nvidia-h200-x4 (carry [".whl",
# ".clean"] in the first: a `git archive` of the commit, run from there; the machine keeps both between calls):
#   bash bench/gpu/x4_round.sh faults      # issue 27: the slowdown faults (a)-(e) on a 4-rank DDP job, then
#                                          #   a healthy stretch (bench/slowdown/gpu_faults.py)
#   bash bench/gpu/x4_round.sh overhead    # issue 29 items 3 and 4 (c): `tuiprof run` and its parts against
#                                          #   plain on a 4-rank DDP transformer, agentd's cost meanwhile
#   bash bench/gpu/x4_round.sh hangs-agent # issue 29 item 10: a 4-rank NCCL hang; the 2-rank overlap with and
#                                          #   without the hook; agentd idle and with 4 busy GPUs (item 4 a, b)
set -u
. bench/gpu/device_env.sh "${OUT:-bench/.work/x4_round}"
export PATH=/tmp/site/bin:$PATH
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; echo "cpus $(nproc)"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
[ -f tuiprof_native/libtuiprof_hook.so ] || python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
ls tuiprof_native/*.so || exit 1
case $1 in
faults)
  timeout $((590 - SECONDS)) python3 bench/slowdown/gpu_faults.py --out "$OUT/faults" --ranks "${RANKS:-4}" --warmup-s 20 \
    --healthy-s "${HEALTHY_S:-120}" --faults "${FAULTS:-gemm,cpu,dataloader,gc,clocks}" ${RECORD:+--record "$OUT/faults/snapshots.bin.gz"} ;;
overhead)
  timeout $((590 - SECONDS)) python3 bench/gpu/overhead_4gpu.py --out "$OUT/overhead" --seconds $((${MEASURE_UNTIL:-450} - SECONDS)) --ranks "${RANKS:-4}" --variants "${VARIANTS:-plain,tuiprof,no_plugin,no_kineto,plain_b}" ;;
hangs-agent)
  echo "== hang, 4 ranks $(date -u +%T)"; timeout 200 python3 bench/hangs/hangs_gpu.py --out "$OUT/hang4" --ranks 4 --repeat 2
  echo "== overlap $(date -u +%T)"; OUT=$OUT/overlap timeout 150 bash bench/gpu/native_gpu.sh overhead
  echo "== agentd idle $(date -u +%T)"
  timeout 80 python3 bench/agent/agentd_cpu_gpu.py --out "$OUT/agentd_idle" --seconds 45 --warmup 10 --profile-seconds 15 > /dev/null
  LOAD='import sys, time, torch
torch.cuda.set_device(int(sys.argv[1])); a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
while True:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.02)'
  for gpu in 0 1 2 3; do python3 -c "$LOAD" $gpu & done
  sleep 5
  echo "== agentd busy $(date -u +%T)"
  timeout 110 python3 bench/agent/agentd_cpu_gpu.py --out "$OUT/agentd_busy" --seconds 60 --warmup 10 --profile-seconds 30 > /dev/null
  kill $(jobs -p) 2>/dev/null
  python3 - <<'PY'
import json, os
for name in ("agentd_idle", "agentd_busy"):
    r = json.load(open(os.path.join(os.environ["OUT"], name, "result.json")))
    print(name, "cpu ms/s", r["agent_cpu_ms_per_s"], "memory", r["memory_kib"], "collectors", r["collector_cpu_ms_per_s"])
    print("  nvml calls/s", r["nvml_calls_per_s"])
PY
  ;;
esac
ls /dev/shm | head
