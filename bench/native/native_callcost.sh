#!/usr/bin/env bash
# Host ns per intercepted cublasGemmEx, plain vs under libtuiprof_hook.so, with the stand-in CUDA
# libraries; given CUDA=1, twice on the GPU machine: with the real cuBLAS and CUDA runtime PyTorch's
# wheels bring (see bench/native/native_callcost.c), and with a cuBLAS that does nothing over that real
# CUDA (bench/native/null_cublas.c: the hook's cost, real event records included, without cuBLAS's own
# host time and its run-to-run noise). Then, CUDA=1 only, the CUDA calls of a timed call alone.
# Three hooked variants, interleaved with plain runs: every call of the shape timed
# (TUIPROF_GEMM_SAMPLE_EVERY=1), every call after the first 32 only counted (=1000000), and the
# default sampling. Prints each run and the medians.
# Usage: bench/native/native_callcost.sh [calls] [rounds]
set -eu
cd "$(dirname "$0")/../.."
N=${1:-1000000}; ROUNDS=${2:-5}
W=bench/.work/callcost; mkdir -p $W; S=tests/native/standins
. bench/native/gpu_libs.sh
if [ "${CUDA:-0}" = 1 ]; then  # the cuBLAS and CUDA runtime PyTorch's wheels bring, else the toolkit's
  read -r CUBLAS CUDART < <(wheel_libs libcublas.so libcudart.so)
  echo "cuBLAS $CUBLAS, CUDA runtime $CUDART"
  rpath="-Wl,-rpath,$(dirname "$CUBLAS"):$(dirname "$CUDART"):\$ORIGIN"
  gcc -O2 -DREAL_CUDA -o $W/callcost bench/native/native_callcost.c "$CUBLAS" "$CUDART" -ldl "$rpath"
  gcc -O1 -shared -fPIC -o $W/libcublas_null.so bench/native/null_cublas.c
  gcc -O2 -DREAL_CUDA -o $W/callcost_null bench/native/native_callcost.c $W/libcublas_null.so "$CUDART" -ldl "$rpath"
  BINARIES="callcost callcost_null"
else
  standin_cuda $W
  gcc -O1 -shared -fPIC -o $W/libcublas.so $S/cublas.c -L$W -Wl,--no-as-needed -lcudart -Wl,--as-needed \
      $W/libcuda.so.1 -Wl,-rpath,'$ORIGIN'
  gcc -O2 -o $W/callcost bench/native/native_callcost.c -L$W -lcublas -Wl,-rpath,'$ORIGIN'
  BINARIES=callcost
fi
HOOK=$PWD/tuiprof_native/libtuiprof_hook.so

compare() {  # $1: the binary
  declare -A runs=([plain]="" [timed]="" [counted]="" [default]="")
  declare -A every=([timed]=1 [counted]=1000000 [default]="")
  for r in $(seq $ROUNDS); do
    read -r ns _ < <($W/$1 $N); runs[plain]+=" $ns"
    for v in timed counted default; do
      read -r ns pid < <(env ${every[$v]:+TUIPROF_GEMM_SAMPLE_EVERY=${every[$v]}} LD_PRELOAD=$HOOK $W/$1 $N)
      runs[$v]+=" $ns"
      rm -f /dev/shm/tuiprof-$(id -u)-$pid  # that run's segment
    done
  done
  echo "== $1"
  for v in plain timed counted default; do echo "$v ns/call:${runs[$v]}"; done
  python3 - "${runs[plain]}" "${runs[timed]}" "${runs[counted]}" "${runs[default]}" <<'PY'
import statistics, sys
plain, *hooked = ([float(x) for x in a.split()] for a in sys.argv[1:])
base = statistics.median(plain)
print(f"median plain {base:.1f} ns/call")
for name, xs in zip(("timed every call", "counted only", "default sampling"), hooked):
    print(f"{name}: median {statistics.median(xs):.1f} ns/call, hook cost {statistics.median(xs) - base:+.1f} ns")
PY
}

for b in $BINARIES; do compare $b; done
if [ "${CUDA:-0}" = 1 ]; then  # what the timed path adds in CUDA calls alone: the runtime's (before), the driver's (now)
  rt=""; drv=""; clk=""
  for r in $(seq $ROUNDS); do
    read -r a b c _ < <($W/callcost $N cuda-apis); rt+=" $a"; drv+=" $b"; clk+=" $c"
  done
  echo "runtime calls of a timed call before (capture check, cudaGetDevice, 2 cudaEventRecord), ns:$rt"
  echo "driver calls of a timed call now (cuStreamIsCapturing, cuCtxGetCurrent, 2 cuEventRecord), ns:$drv"
  echo "its clock read (clock_gettime CLOCK_REALTIME), ns:$clk"
fi
