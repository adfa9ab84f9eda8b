#!/usr/bin/env bash
# Host ns per intercepted cublasGemmEx, plain vs under libtuiprof_hook.so, with stand-in CUDA libraries.
# Interleaved runs; prints each and the medians. Usage: bench/native_callcost.sh [calls] [rounds]
set -eu
cd "$(dirname "$0")/.."
N=${1:-1000000}; ROUNDS=${2:-5}
W=bench/.work/callcost; mkdir -p $W; S=tests/native/standins
gcc -O1 -shared -fPIC -o $W/libcudart.so $S/cudart.c
gcc -O1 -shared -fPIC -o $W/libcublas.so $S/cublas.c -L$W -lcudart -Wl,-rpath,'$ORIGIN'
gcc -O2 -o $W/callcost bench/native_callcost.c -L$W -lcublas -Wl,-rpath,'$ORIGIN'
HOOK=$PWD/tuiprof_native/libtuiprof_hook.so
plain=(); hooked=()
for r in $(seq $ROUNDS); do
  read -r ns _ < <($W/callcost $N); plain+=($ns)
  read -r ns pid < <(LD_PRELOAD=$HOOK $W/callcost $N); hooked+=($ns)
  rm -f /dev/shm/tuiprof-$(id -u)-$pid  # that run's segment
done
echo "plain ns/call:  ${plain[*]}"; echo "hooked ns/call: ${hooked[*]}"
python3 -c "import statistics,sys; p=[float(x) for x in sys.argv[1].split()]; h=[float(x) for x in sys.argv[2].split()]; print(f'median plain {statistics.median(p):.1f} ns, hooked {statistics.median(h):.1f} ns, hook cost {statistics.median(h)-statistics.median(p):.1f} ns per call')" "${plain[*]}" "${hooked[*]}"
