#!/usr/bin/env bash
# GPU run of bench/gpu/native_gpu.py on 2 GPUs: build, accuracy under `tuiprof run`, then interleaved
# overhead rounds (plain / tuiprof / TORCH_NCCL_ENABLE_TIMING=1). Results in $OUT (or ./bench/.work).
set -u
OUT=${OUT:-bench/.work}
WORK=$(mktemp -d /tmp/tuiprof-bench.XXXX)  # per-process JSON; $OUT gets the log, report and summary
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi -L; which gcc cc; python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())'
python3 setup.py -q build_ext --inplace 2>&1 | tail -5
ls -la tuiprof_native/*.so || exit 1
RUN=(python3 bench/gpu/tuiprof_headless.py run --no-kineto-daemon --)
TR=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
PHASES=${1:-accuracy overhead}  # bench/gpu/native_gpu.sh [accuracy] [overhead]
if [[ $PHASES == *accuracy* ]]; then
  echo "== accuracy"; "${RUN[@]}" "${TR[@]}" bench/gpu/native_gpu.py --mode accuracy --out "$WORK"
fi
export CUDA_DEVICE_MAX_CONNECTIONS=1
for round in 1 2 3; do
  [[ $PHASES == *overhead* ]] || break
  echo "== round $round plain";      "${TR[@]}" bench/gpu/native_gpu.py --mode overhead --out "$WORK" --label plain --round $round
  echo "== round $round tuiprof";    "${RUN[@]}" "${TR[@]}" bench/gpu/native_gpu.py --mode overhead --out "$WORK" --label tuiprof --round $round
  echo "== round $round ncclTiming"; TORCH_NCCL_ENABLE_TIMING=1 "${TR[@]}" bench/gpu/native_gpu.py --mode overhead --out "$WORK" --label nccl_timing --round $round
done
python3 bench/gpu/native_gpu_report.py "$WORK" "$OUT/results.json" > "$OUT/report.md"; cat "$OUT/report.md"
ls /dev/shm
