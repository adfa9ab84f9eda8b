#!/usr/bin/env bash
# `tuiprof trace` on a real 2-rank CUDA job (2 x H200): build, start agentd, start
# bench/traces/traces_gpu_job.py under `tuiprof run` + torchrun, capture --iterations and
# --duration-ms, keep the CLI's JSON, the per-rank traces and the merged files.
# Results in $OUT (log.txt, traces.tar.gz); bench/traces/traces_gpu.py compares them with HTA.
set -u
OUT=${OUT:-bench/.work/traces_gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machine's rule
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/tuiprof-traces-gpu.XXXX)
# Outside /tmp on purpose: newer Kineto writes there only because `tuiprof run` sets
# KINETO_ONDEMAND_TRACE_DIR to the agent's trace dir.
TRACE_DIR=${TRACE_DIR:-/var/lib/tuiprof-bench/traces}
PORT=${PORT:-1779} METRICS_PORT=${METRICS_PORT:-9779}
PY=${PY:-python3}
nvidia-smi -L; nvidia-smi topo -m
$PY -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
$PY -c 'import grpc, google.protobuf, msgspec, textual; print("grpc", grpc.__version__, "protobuf", google.protobuf.__version__, "msgspec", msgspec.__version__)'
[[ ${BUILD:-1} == 1 ]] && $PY setup.py -q build_ext --inplace 2>&1 | tail -3
ls tuiprof_native/*.so || exit 1

$PY -m agentd.cli --host 127.0.0.1 --port $PORT --metrics-port $METRICS_PORT --trace-dir "$TRACE_DIR" \
  --interval-ms 1000 2> "$WORK/agentd.log" &
AGENT=$!
healthy() { $PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/healthz', timeout=1)" 2>/dev/null; }
for _ in $(seq 100); do healthy && break; sleep 0.2; done
healthy || { echo "agentd not healthy"; cat "$WORK/agentd.log"; exit 1; }

$PY -m tuiprof.cli run --agent-port $PORT -- $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
  ${JOB:-bench/traces/traces_gpu_job.py} --ready-dir "$WORK/job" --seconds 150 > "$WORK/job.log" 2>&1 &
JOB=$!
for _ in $(seq 600); do [[ -e $WORK/job/ready.0 && -e $WORK/job/ready.1 ]] && break; sleep 0.2; done
cat "$WORK/job.log"
for ready in "$WORK"/job/ready.*; do
  pid=$(cat "$ready")
  echo "rank pid $pid: $(tr '\0' '\n' < /proc/$pid/environ | grep -E '^KINETO_(ONDEMAND_TRACE_DIR|USE_DAEMON)=' | tr '\n' ' ')"
done
sleep 6  # libkineto's first daemon poll

capture() {  # capture NAME ARGS...: the CLI's JSON, its wall time
  local name=$1; shift
  local t0=$(date +%s%N)
  $PY -m tuiprof.cli trace 127.0.0.1:$PORT "$@" --output "$WORK/$name" --json > "$WORK/$name.json"
  local rc=$?
  echo "== $name: rc $rc, wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  $PY - "$WORK/$name.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("seconds", d["seconds"], "delivered", d["all_delivered"], "merged", d["merged"])
for h in d["hosts"]:
    for t in h["targets"]:
        print(" ", h["host"], "rank", t["rank"], "pid", t["pid"], t["state"], t["file"], t["reason"] or "")
for r in (d["summary"] or {}).get("ranks", []):
    print("  rank", r["rank"], {k: r[k] for k in ("gpu_kernels", "span_us", "compute_us", "communication_us",
          "memory_us", "idle_us", "overlap_percent", "step_time_us", "steps")})
EOF
}
for round in $(seq ${ROUNDS:-3}); do  # the files of round 1 come back
  capture iterations$round --iterations 5
  [[ $round == 1 || -z ${ITERATIONS_ONLY:-} ]] && capture duration$round --duration-ms 300
done
$PY - "$WORK/iterations1/merged.trace.json.gz" <<'EOF'
import collections, gzip, json, sys
events = json.loads(gzip.decompress(open(sys.argv[1], "rb").read()))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
print("kernel tracks", dict(collections.Counter(names[e["pid"]] for e in events if e.get("cat") == "kernel")))
EOF
touch "$WORK/job/stop"; wait $JOB; echo "job exit $?"
tail -5 "$WORK/job.log"
kill $AGENT; wait $AGENT
grep -ciE "warn|error" "$WORK/agentd.log"; tail -5 "$WORK/agentd.log"
find "$TRACE_DIR" -type f -ls
(cd "$WORK" && tar czf "$OUT/traces.tar.gz" --ignore-failed-read iterations1 duration1 ./*.json ./*.log)
ls -la "$OUT"
