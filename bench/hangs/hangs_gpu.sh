#!/usr/bin/env bash
# GPU run of bench/hangs/hangs_gpu.py on 2 GPUs: build the package in place, then the hang run.
# Wheels the GPU machine lacks (py-spy, protobuf 7.36, grpcio 1.85) are installed from ./.whl
# when present (see bench/hangs/hangs_gpu.md). Results in $OUT (or ./bench/.work).
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
python3 -c 'import torch, grpc, google.protobuf as p; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "grpcio", grpc.__version__, "protobuf", p.__version__)'
py-spy --version
python3 setup.py -q build_ext --inplace 2>&1 | tail -5
ls tuiprof_native/*.so || exit 1
timeout 400 python3 bench/hangs/hangs_gpu.py --out "$OUT"
ls /dev/shm
