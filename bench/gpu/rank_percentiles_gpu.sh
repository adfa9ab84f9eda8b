#!/usr/bin/env bash
# Issue 29 item 1 on 2 GPUs (bench/gpu/rank_percentiles_gpu.py): agentd's per-interval p50/p99/max of NCCL
# all-reduces (16 MiB, 256 MiB, 1 GiB) and of one bf16 GEMM shape against the program's own CUDA events.
# One device call (~2 min), kind nvidia-h200-x2, carry [".whl"] (wheels of msgspec, grpcio, protobuf at
# the versions pyproject.toml asks for, as for bench/agent/agentd_cpu_gpu.sh):  OUT=$OUT bash bench/gpu/rank_percentiles_gpu.sh
# Results in $OUT: log.txt (versions and the table), report.json, snapshots.json, worker_*.json.
set -u
. bench/gpu/device_env.sh bench/.work/rank_percentiles
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
python3 -c 'from tuiprof_native import segment; print("segment layout", segment.LAYOUT_VERSION, segment.SEGMENT_SIZE, "bytes")'
timeout 540 python3 bench/gpu/rank_percentiles_gpu.py --out "$OUT" --world "${WORLD:-2}"
