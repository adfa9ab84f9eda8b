#!/usr/bin/env bash
# Issue 13's GPU figures on one GPU (bench/gpu/rank_figures_gpu.md), in two device calls issued back to
# back (the 10-minute run outlives the first; the machine stays warm 30 s between calls):
#   bash bench/gpu/rank_figures_gpu.sh first    # setup, start the 10-minute run, accuracy, timeline,
#                                           # event cost, host cost; holds the call until ~560 s
#   bash bench/gpu/rank_figures_gpu.sh second   # collect the 10-minute run, then the overhead pairs
#   bash bench/gpu/rank_figures_gpu.sh again    # one call: accuracy, timeline and a 470 s run at 500 ms
#                                           # (run 2, after the hook's first-call fix; see the .md)
#   bash bench/gpu/rank_figures_gpu.sh weighted # one call (< 3 min): accuracy only (run 3, the weighted
#                                           # estimator; run 4, adaptive sampling; see the .md)
#   bash bench/gpu/rank_figures_gpu.sh overhead30  # one call: PAIRS (10) pairs of the ~30 ms step (run 6)
#   bash bench/gpu/rank_figures_gpu.sh alternating # one call: chunks alternating between two long-lived
#                                              # processes, plain and hooked (run 6)
# Wheels for grpcio and msgspec in .whl/ (carried). Summaries go to $OUT, everything else to /tmp.
set -u
OUT=${OUT:-bench/.work/rank_figures}; WORK=/tmp/rank_figures_$1
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/log.txt") 2>&1
[ -d /tmp/site/grpc ] && [ -d /tmp/site/msgspec ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
build() { python3 setup.py -q build_ext --inplace 2>&1 | tail -3; ls tuiprof_native/*.so || exit 1; }
phase() { echo "== $1 $(date -u +%T)"; timeout "$2" python3 bench/gpu/rank_figures_gpu.py "$1" --out "$WORK" "${@:3}"; echo "rc=$?"; }
case $1 in
first)
  nvidia-smi -L; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'
  build
  phase long-start 30
  phase accuracy 200
  phase timeline 200
  phase eventcost 240
  echo "== host cost $(date -u +%T)"; CUDA=1 timeout 200 bash bench/native/native_callcost.sh 200000 5 | tee "$OUT/callcost.txt"
  cp "$WORK"/{long-start,accuracy,timeline,eventcost}.json "$OUT"/
  tar czf "$OUT/logs_first.tgz" -C "$WORK" --exclude='*_worker.json' . 2>/dev/null
  while [ $SECONDS -lt "${HOLD_UNTIL:-560}" ]; do sleep 5; done ;;
second)
  phase long-collect 440
  phase overhead 520
  cp "$WORK"/{long-collect,overhead}.json "$OUT"/
  tar czf "$OUT/logs_second.tgz" -C "$WORK" . /tmp/rank_figures_long/*.log 2>/dev/null ;;
again)
  nvidia-smi -L; build
  phase long-start 30 --long-seconds 470 --intervals 500
  phase accuracy 200
  phase timeline 200
  phase long-collect 560 --long-seconds 470
  cp "$WORK"/{long-start,accuracy,timeline,long-collect}.json "$OUT"/
  tar czf "$OUT/logs_again.tgz" -C "$WORK" --exclude='*_worker.json' . /tmp/rank_figures_long/*.log 2>/dev/null ;;
weighted)
  nvidia-smi -L; build
  phase accuracy 150
  cp "$WORK"/accuracy.json "$OUT"/ ;;
round4)
  nvidia-smi -L; build
  phase long-start 30
  echo "== console_nvitop $(date -u +%T)"
  OUT=$OUT/console WHEELS=.whl-console TERMINALS=pty SECONDS_MEASURED=60 WARMUP=15 timeout 300 bash bench/console/console_nvitop.sh >/dev/null
  echo "== agentd_cpu_gpu $(date -u +%T)"
  OUT=$OUT/agentd timeout 200 bash bench/agent/agentd_cpu_gpu.sh >/dev/null
  cp "$WORK"/long-start.json "$OUT"/
  while [ $SECONDS -lt "${HOLD_UNTIL:-585}" ]; do sleep 5; done ;;
round4-collect)
  phase long-collect 150
  phase overhead 430
  cp "$WORK"/{long-collect,overhead}.json "$OUT"/
  tar czf "$OUT/logs_round4.tgz" -C "$WORK" . /tmp/rank_figures_long/*.log 2>/dev/null ;;
overhead)
  nvidia-smi -L; build
  PYTHONUNBUFFERED=1 phase overhead 540
  cp "$WORK"/overhead.json "$OUT"/ ;;
overhead30)
  # one call: what each NVML call costs (NVML_PROBE=1; bench/console/nvml_call_cost.py), then PAIRS pairs of
  # the ~30 ms step alone; issued back to back, the calls' pairs are combined with overhead-combine
  nvidia-smi -L; build
  [ "${NVML_PROBE:-0}" = 1 ] && timeout 60 python3 bench/console/nvml_call_cost.py > "$OUT/nvml_call_cost.json"
  PYTHONUNBUFFERED=1 phase overhead "${PHASE_S:-540}" --pairs "${PAIRS:-10}" --sizes 30ms
  cp "$WORK"/overhead.json "$OUT"/ ;;
alternating)
  # one call: two long-lived processes (plain, hooked), 300-step chunks alternating ABBA (run 6)
  nvidia-smi -L; build
  [ "${NVML_PROBE:-0}" = 1 ] && timeout 60 python3 bench/console/nvml_call_cost.py > "$OUT/nvml_call_cost.json"
  PYTHONUNBUFFERED=1 phase overhead-alternating 560 --pairs 60 --sizes "${SIZE:-30ms}" --seconds "${RUN_S:-470}"
  cp "$WORK"/overhead-alternating.json "$OUT"/ ;;
esac
