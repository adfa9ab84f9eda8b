#!/usr/bin/env bash
# GPU run of the slowdown benches on 4 GPUs: build the package in place, the console's verdict work at
# 1024 simulated ranks (scale.py) on this host's CPU, then the fault run (gpu_faults.py; its arguments
# are this script's). Wheels the GPU machine lacks (protobuf 7.36, grpcio 1.85, setuptools, cython) are
# installed from ./.whl when present. Results in $OUT (or ./bench/.work).
set -u
. bench/gpu/device_env.sh "${OUT:-bench/.work}"
export PATH=/tmp/site/bin:$PATH
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
lscpu | grep -E "Model name|^CPU\(s\)"
python3 setup.py -q build_ext --inplace 2>&1 | tail -5
ls tuiprof_native/*.so || exit 1
PYTHONPATH=.:${PYTHONPATH:-} python3 bench/slowdown/scale.py | tee "$OUT/scale.txt"
timeout 540 python3 bench/slowdown/gpu_faults.py --out "$OUT" "$@"
