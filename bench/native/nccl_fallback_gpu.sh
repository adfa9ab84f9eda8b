#!/usr/bin/env bash
# Issue 16, item 5, on one GPU: the hook's NCCL API fallback against the real NCCL PyTorch ships
# (2.28), with the profiler plugin not loaded (NCCL_PROFILER_PLUGIN unset: NCCL looks for no plugin),
# under nccl-tests' all_reduce_perf -g 1 (built here; source carried in .carry/nccl-tests, never
# committed): the op count the hook records against the count nccl-tests' loops issue, counted-only
# and timed modes, per-size event time beside nccl-tests' time; then the plugin set: the fallback
# must record nothing; then the host cost per real ncclAllReduce (bench/native/nccl_fallback_callcost.sh).
# Results in $OUT (log.txt, *.txt).
# Given NCCL_HOME (a folder with include/nccl.h and lib/libnccl.so.2, e.g. a real NCCL 2.18 or 2.21 from
# its PyPI wheel, slimmed by bench/gpu/slim_libnccl.py: issue 29 item 9), nccl-tests is built against it
# and PyTorch loads it first (LD_PRELOAD after the hook), instead of the NCCL PyTorch ships.
set -u
. bench/gpu/device_env.sh bench/.work/nccl_fallback
unset NCCL_PROFILER_PLUGIN TUIPROF_NCCL_FALLBACK
nvidia-smi -L
TORCH_NCCL=""  # what PyTorch preloads besides the hook: nothing, or the NCCL given
if [ -n "${NCCL_HOME:-}" ]; then TORCH_NCCL=$NCCL_HOME/lib/libnccl.so.2; else
  NCCL_HOME=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])'); fi
python3 -c 'import torch; print("torch", torch.__version__, "built with nccl", torch.cuda.nccl.version())'
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -s libnccl.so.2 "$NCCL_HOME/lib/libnccl.so"
TESTS=/tmp/nccl-tests-$(grep -h -m3 -E '#define NCCL_(MAJOR|MINOR|PATCH) ' "$NCCL_HOME/include/nccl.h" | awk '{printf "%s.", $3}')
echo "nccl-tests in $TESTS, against $NCCL_HOME"
[ -x "$TESTS/all_reduce_perf" ] || make -s -C "${NCCL_TESTS_SRC:-.carry/nccl-tests}/src" -j16 \
  BUILDDIR="$TESTS" NCCL_HOME="$NCCL_HOME" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
  BIN_FILES_LIST="all_reduce" build 2>&1 | grep -v -i warning | tail -5
export LD_LIBRARY_PATH="$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}"
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
HOOK=$PWD/tuiprof_native/libtuiprof_hook.so
# 1 KiB .. 1 MiB by 4 (6 sizes), 5 warm-up and 20 timed iterations, data check on
ARGS=(-b 1K -e 1M -f 4 -w 5 -n 20 -c 1 -d float -g 1)
# nccl-tests' loops (src/common.cu TimeTest/BenchTime): warm-up over every size doubling from -b to
# -e (11 sizes x 5; before nccl-tests 2.14, at the largest and the smallest size only: 2 x 5), then per
# size out-of-place and in-place, each 1 sync op + 20 timed + 1 check
WARMUP_OPS=$((11 * 5))
grep -q "Warm-up for large size" "${NCCL_TESTS_SRC:-.carry/nccl-tests}/src/common.cu" && WARMUP_OPS=$((2 * 5))
EXPECTED=$((WARMUP_OPS + 6 * 2 * (1 + 20 + 1)))
$TESTS/all_reduce_perf "${ARGS[@]}" > "$OUT/plain.txt" 2>&1; tail -12 "$OUT/plain.txt"
hooked() {  # name, env...: all_reduce_perf under the hook; prints the pid (names its segment)
  local name=$1; shift
  bash -c 'echo $$ > "$0"; exec env "$@"' "$OUT/$name.pid" "$@" LD_PRELOAD="$HOOK" \
    $TESTS/all_reduce_perf "${ARGS[@]}" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $?"; tail -12 "$OUT/$name.txt"
}
hooked counted TUIPROF_NCCL_FALLBACK=0
hooked timed TUIPROF_NCCL_FALLBACK=1
hooked plugin NCCL_PROFILER_PLUGIN="$HOOK" TUIPROF_NCCL_FALLBACK=1
# PyTorch's own path (libtorch_cuda -> libnccl, communicator from ncclCommInitRankConfig): one rank,
# 10 all-reduces of 1 Mi fp32, timed fallback
# This PyTorch binds NCCL's newer functions at load: stubs for those an older NCCL lacks (nccl_stubs.py).
[ -n "$TORCH_NCCL" ] && TORCH_NCCL="$TORCH_NCCL $(python3 bench/gpu/nccl_stubs.py "$TORCH_NCCL" /tmp/nccl_stubs)"
bash -c 'echo $$ > "$0"; exec env "$@"' "$OUT/torch.pid" TUIPROF_NCCL_FALLBACK=1 LD_PRELOAD="$HOOK $TORCH_NCCL" python3 -c '
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
for _ in range(10):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.destroy_process_group()
print("torch: 10 all_reduce done with nccl", torch.cuda.nccl.version())' > "$OUT/torch.txt" 2>&1
echo "torch: exit $?"; tail -3 "$OUT/torch.txt"
python3 - "$OUT" "$EXPECTED" <<'PY'
import collections, glob, os, re, statistics, sys
from tuiprof_native import segment
out, expected = sys.argv[1], int(sys.argv[2])
def seg(name):
    pid = open(f"{out}/{name}.pid").read().strip()
    (path,) = [p for p in glob.glob(f"{segment.SEGMENT_DIR}/tuiprof-{os.getuid()}-{pid}-*")
               if "." not in os.path.basename(p)]  # not its side files (.exception, .flight)
    return segment.Segment(path)
def flags(h):
    return [n for n in ("CUDA_TIMING", "NCCL_PLUGIN", "NCCL_GPU_TIME", "NCCL_API", "NCCL_API_EVENTS")
            if h.flags & getattr(segment, "FLAG_" + n)]
tests_time = {}  # bytes -> (out-of-place us, in-place us) from nccl-tests' table
for line in open(f"{out}/timed.txt"):
    f = line.split()
    if len(f) >= 13 and f[0].isdigit():
        tests_time[int(f[0])] = (float(f[5]), float(f[9]))
for name in ("counted", "timed", "plugin", "torch"):
    if name == "torch":
        expected = 10
    s = seg(name)
    h = s.header()
    slots = [x for x in s.slots() if x.kind == "nccl"]
    print(f"{name}: flags {flags(h)}; nccl slots {[(x.op, x.dtype, x.algo, x.count, x.timed_count, hex(x.comm_hash), x.nranks) for x in slots]}; "
          f"untimed {h.counters.nccl_untimed}, dropped {h.counters.dropped_records}; expected ops {expected}: "
          f"{'EQUAL' if sum(x.count for x in slots) == expected else 'DIFFERENT'}")
    if name == "timed":
        ring = s.events()
        print(f"event ring: {len(ring)} events, by kind {collections.Counter(e.kind for e in ring)}; "
              f"timed slot mean {[round(x.total_ns / x.timed_count / 1e3, 2) for x in slots if x.timed_count]} us, "
              f"min {[x.min_ns / 1e3 for x in slots]} us, max {[x.max_ns / 1e3 for x in slots]} us")
        by_size = {}
        for e in s.events():
            if e.kind == "nccl" and e.end_ns:
                by_size.setdefault(e.bytes, []).append((e.end_ns - e.start_ns) / 1e3)
        print("bytes  ops  event-pair median us  mean us | nccl-tests time us (out-of-place, in-place)")
        for size in sorted(by_size):
            xs = by_size[size]
            print(f"{size:>8} {len(xs):>4} {statistics.median(xs):>10.2f} {statistics.mean(xs):>10.2f} | "
                  f"{tests_time.get(size, ('-', '-'))}")
PY
[ -n "$TORCH_NCCL" ] || REAL_NCCL=1 PYTHON=python3 bash bench/native/nccl_fallback_callcost.sh 20000 3
