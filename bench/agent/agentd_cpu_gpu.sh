#!/usr/bin/env bash
# On the GPU machine: bench/agent/agentd_cpu_gpu.py (agentd's CPU, each collector's time, a py-spy
# profile) under a light matmul load, and bench/agent/event_record_cost.c (the host cost of each CUDA
# call a timed GEMM makes). Wheels (grpcio, msgspec, py-spy) in $WHEELS; results in $OUT.
set -u
OUT=${OUT:-bench/.work/agentd_cpu_gpu}; WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi -L; echo "cpus $(nproc)"
python3 setup.py -q build_ext --inplace 2>&1 | tail -3
CUDART=$(python3 -c 'import glob,os,sys; print(sorted(glob.glob(os.path.join(os.path.dirname(__import__("nvidia").__path__[0]), "nvidia", "**", "libcudart.so.*[0-9]"), recursive=True))[0])')
gcc -O2 -o /tmp/event_record_cost bench/agent/event_record_cost.c "$CUDART" -ldl -Wl,-rpath,"$(dirname "$CUDART")" && /tmp/event_record_cost
python3 - <<'PY' &
import time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
until = time.time() + 150
while time.time() < until:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.02)
PY
LOAD=$!
sleep 5
python3 bench/agent/agentd_cpu_gpu.py --out "$OUT" --seconds 60 --warmup 15 --profile-seconds 40
kill $LOAD 2>/dev/null
