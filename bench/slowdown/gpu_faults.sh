#!/usr/bin/env bash
# GPU run of the slowdown benches on 4 GPUs: build the package in place, the console's verdict work at
# 1024 simulated ranks (scale.py) on this host's CPU, then the fault run (gpu_faults.py; its arguments
# are this script's). Wheels the GPU machine lacks (protobuf 7.36, grpcio 1.85, setuptools, cython) are
# installed from ./.whl when present. Results in $OUT (or ./bench/.work).
set -u
OUT=${OUT:-bench/.work}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
lscpu | grep -E "Model name|^CPU\(s\)"
python3 setup.py -q build_ext --inplace 2>&1 | tail -5
ls tuiprof_native/*.so || exit 1
PYTHONPATH=.:${PYTHONPATH:-} python3 bench/slowdown/scale.py | tee "$OUT/scale.txt"
timeout 540 python3 bench/slowdown/gpu_faults.py --out "$OUT" "$@"
