#!/usr/bin/env bash
# Host ns per ncclAllReduce, plain vs under libtuiprof_hook.so's NCCL API fallback: counting only
# (the default) and timed (TUIPROF_NCCL_FALLBACK=1, an event pair per call), interleaved over
# ROUNDS, with the stand-in NCCL 2.21.5 and CUDA runtime (or, given REAL_NCCL=1 on a GPU machine,
# the NCCL and CUDA runtime PyTorch's wheels bring: see bench/native/nccl_fallback_callcost.c).
# Prints each run, the records each hooked run dropped (must be 0) and the medians.
# Usage: bench/native/nccl_fallback_callcost.sh [calls] [rounds]
set -eu
cd "$(dirname "$0")/../.."
N=${1:-100000}; ROUNDS=${2:-5}
PY=${PYTHON:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
W=bench/.work/nccl_callcost; mkdir -p $W; S=tests/native/standins
. bench/native/gpu_libs.sh
if [ "${REAL_NCCL:-0}" = 1 ]; then
  read -r NCCL CUDART < <(wheel_libs libnccl.so libcudart.so)
  echo "NCCL $NCCL, CUDA runtime $CUDART"
  gcc -O2 -DREAL_NCCL -o $W/callcost bench/native/nccl_fallback_callcost.c "$NCCL" "$CUDART" \
      -Wl,-rpath,"$(dirname "$NCCL"):$(dirname "$CUDART")"
  unset NCCL_PROFILER_PLUGIN  # NCCL then loads no profiler plugin: the fallback records
else
  standin_cuda $W
  gcc -O1 -shared -fPIC -o $W/libnccl.so $S/nccl_api.c
  gcc -O2 -o $W/callcost bench/native/nccl_fallback_callcost.c -L$W -lnccl -Wl,--no-as-needed -lcudart -Wl,--as-needed \
      $W/libcuda.so.1 -Wl,-rpath,'$ORIGIN'
fi
HOOK=$PWD/tuiprof_native/libtuiprof_hook.so
declare -A runs=([plain]="" [counted]="" [timed]="")
declare -A mode=([counted]=0 [timed]=1)
drops=""
for r in $(seq $ROUNDS); do
  read -r ns _ < <($W/callcost $N); runs[plain]+=" $ns"
  for v in counted timed; do
    read -r ns pid < <(TUIPROF_NCCL_FALLBACK=${mode[$v]} LD_PRELOAD=$HOOK $W/callcost $N)
    runs[$v]+=" $ns"
    seg=/dev/shm/tuiprof-$(id -u)-$pid
    drops+=" $v:$($PY -c "import sys; from tuiprof_native import segment as s; h = s.Segment(sys.argv[1]).header(); \
print(h.counters.dropped_records, 'ops', sum(x.count for x in s.Segment(sys.argv[1]).slots() if x.kind == 'nccl'))" $seg)"
    rm -f $seg
  done
done
for v in plain counted timed; do echo "$v ns/call:${runs[$v]}"; done
echo "dropped records, ops recorded per hooked run:$drops"
$PY - "${runs[plain]}" "${runs[counted]}" "${runs[timed]}" <<'PY'
import statistics, sys
plain, *hooked = ([float(x) for x in a.split()] for a in sys.argv[1:])
base = statistics.median(plain)
print(f"median plain {base:.1f} ns/call")
for name, xs in zip(("counted only (default)", "timed (TUIPROF_NCCL_FALLBACK=1)"), hooked):
    print(f"{name}: median {statistics.median(xs):.1f} ns/call, hook cost {statistics.median(xs) - base:+.1f} ns")
PY
