#!/usr/bin/env bash
# Issue 16, item 1, on 2 GPUs: nccl-tests (built here against the NCCL PyTorch ships) and the same
# collectives through PyTorch under `tuiprof run`, 1 MiB .. 1 GiB, side by side (bench/gpu/nccl_busbw_gpu.py).
# nccl-tests' source is carried, never committed: NCCL_TESTS_SRC (default .carry/nccl-tests, from
# github.com/NVIDIA/nccl-tests). Results in $OUT (log.txt, *_perf.txt, torch-*.json, report.md).
set -u
. bench/gpu/device_env.sh bench/.work/nccl_busbw
nvidia-smi -L
NCCL_HOME=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -s libnccl.so.2 "$NCCL_HOME/lib/libnccl.so"
make -s -C "${NCCL_TESTS_SRC:-.carry/nccl-tests}/src" -j16 BUILDDIR=/tmp/nccl-tests NCCL_HOME="$NCCL_HOME" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BIN_FILES_LIST="all_reduce all_gather reduce_scatter" \
  build 2>&1 | grep -v -i warning | tail -5
export LD_LIBRARY_PATH="$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}"
for test in all_reduce_perf all_gather_perf reduce_scatter_perf; do
  /tmp/nccl-tests/$test -b 1M -e 1G -f 2 -g 2 -d bfloat16 -w 5 -n 20 > "$OUT/$test.txt" 2>&1
  tail -4 "$OUT/$test.txt"
done
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
RUN=(python3 bench/gpu/tuiprof_headless.py run --no-kineto-daemon --)
"${RUN[@]}" python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/gpu/nccl_busbw_gpu.py --worker --out "$OUT"
python3 bench/gpu/nccl_busbw_gpu.py --report --out "$OUT"
