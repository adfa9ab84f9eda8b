#!/usr/bin/env bash
# Issue 29 items 7 and 9 on one GPU: the hook's NCCL profiler plugin (API v1-v6) and its API fallback
# against real NCCL releases, and chaining to NCCL's own profiler plugins.
#
# Each release is a real nvidia-nccl-cu12/-cu13 wheel's libnccl.so.2, slimmed here by slim_libnccl.py
# and unpacked there into /tmp/nccl/VERSION/lib (several device calls, a few releases each, on one warm
# machine: see bench/gpu/nccl_versions_gpu.md); the NCCL PyTorch ships (2.28.9) is added to them.
# 1. nccl_profiler_versions.py over every release: two ranks on one GPU, the API NCCL took, the
#    segment's counts against the program's.
# 2. The same job on 2.28.9 (API v5) and 2.30.7 (v6) with NCCL_PROFILER_PLUGIN set to NCCL's example
#    profiler plugin (built here from .carry/nccl-profiler/example, NCCL master; its dump counted), and
#    on 2.28.9 with NCCL's Inspector (.carry/nccl-profiler/inspector).
set -u
. bench/gpu/device_env.sh bench/.work/nccl_versions
nvidia-smi -L
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -3
OWN=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')/lib/libnccl.so.2
mkdir -p /tmp/nccl/2.28.9/lib && cp "$OWN" /tmp/nccl/2.28.9/lib/
ls /tmp/nccl
python3 bench/gpu/nccl_profiler_versions.py --nccl-dir /tmp/nccl --out "$OUT/versions"

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
g++ -O2 -I.carry/nccl-profiler/example/nccl -I"$CUDA_HOME/include" -fPIC -shared \
  -o /tmp/libnccl-profiler-example.so .carry/nccl-profiler/example/*.cc || echo "example plugin: build failed"
make -s -C .carry/nccl-profiler/inspector CUDA_HOME="$CUDA_HOME" > /tmp/inspector-build.txt 2>&1 \
  || { echo "inspector: build failed"; tail -5 /tmp/inspector-build.txt; }
INSPECTOR=$(find .carry/nccl-profiler/inspector -name 'libnccl-profiler-inspector.so' | head -1)
mkdir -p /tmp/nccl-chain/2.28.9 /tmp/nccl-chain/2.30.7
cp -l /tmp/nccl/2.28.9/lib/libnccl.so.2 /tmp/nccl-chain/2.28.9/ && cp -l /tmp/nccl/2.30.7/lib/libnccl.so.2 /tmp/nccl-chain/2.30.7/
mkdir -p /tmp/example-dump
# its default pools keep the last 8 events of a kind: room for the whole job; CollApi (512) too
POOLS=(NCCL_PROFILE_COLL_POOL_SIZE=4096 NCCL_PROFILE_P2P_POOL_SIZE=4096 NCCL_PROFILE_COLL_API_POOL_SIZE=4096
       NCCL_PROFILE_P2P_API_POOL_SIZE=4096 NCCL_PROFILE_GROUP_POOL_SIZE=4096 NCCL_PROFILE_GROUP_API_POOL_SIZE=4096)
env "${POOLS[@]}" NCCL_PROFILE_EVENT_MASK=518 NCCL_PROFILE_DUMP_FILE=/tmp/example-dump/trace \
  python3 bench/gpu/nccl_profiler_versions.py --nccl-dir /tmp/nccl-chain --out "$OUT/chain-example" \
  --chain /tmp/libnccl-profiler-example.so --port 29600
python3 - /tmp/example-dump <<'PY'
import collections, json, pathlib, sys
for dump in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    text = dump.read_text().rstrip().rstrip(",")
    events = json.loads(text + ("" if text.endswith("]") else "]"))
    begun = collections.Counter(f'{e["cat"]} {e["name"]}' for e in events
                                if e.get("ph") == "b" and e.get("cat") in ("COLL", "P2P", "COLL_API"))
    print(f"example plugin dump {dump.name}: {dict(sorted(begun.items()))}")
PY
if [ -n "$INSPECTOR" ]; then
  rm -rf /tmp/nccl-chain/2.30.7; mkdir -p /tmp/inspector-dump
  NCCL_INSPECTOR_ENABLE=1 NCCL_INSPECTOR_DUMP_DIR=/tmp/inspector-dump \
    python3 bench/gpu/nccl_profiler_versions.py --nccl-dir /tmp/nccl-chain --out "$OUT/chain-inspector" \
    --chain "$PWD/$INSPECTOR" --port 29620
  find /tmp/inspector-dump -type f | head; find /tmp/inspector-dump -type f | head -2 | xargs -r head -c 1500
fi
tar czf "$OUT/dumps.tgz" -C /tmp example-dump inspector-dump 2>/dev/null
