#!/usr/bin/env bash
# bench/console/console_nvitop.py on a machine without a GPU: nvitop and tuiprof side by side in one run,
# both reading one stand-in H100 (bench/console/fake_nvml.c, built here, loaded by both through the real
# nvidia-ml-py) with two sleeping processes on it. NVML answers in microseconds, so this compares
# each tool's own work (Python, drawing, /proc); NVML's cost on a real GPU is in console_nvitop.md.
#
#   NVITOP_WHEELS=DIR SECONDS_MEASURED=60 WARMUP=15 OUT=DIR bash bench/console/console_nvitop_vm.sh
# NVITOP_WHEELS: a folder with nvitop 1.7.2's and nvidia-ml-py 13.615.71's wheels (else from PyPI).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/.work/console_nvitop_vm}
work=$(mktemp -d /tmp/console-nvitop-vm.XXXXXX)
sleepers=()
trap 'kill "${sleepers[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

cc -shared -fPIC -O2 -Wall -o "$work/libnvidia-ml.so.1" bench/console/fake_nvml.c
if [ -n "${NVITOP_WHEELS:-}" ]; then
    .venv/bin/pip install -q --no-deps --target "$work/nvitop" "$NVITOP_WHEELS"/nvitop-1.7.2-*.whl \
        "$NVITOP_WHEELS"/nvidia_ml_py-13.615.71-*.whl
else
    .venv/bin/pip install -q --no-deps --target "$work/nvitop" nvitop==1.7.2 nvidia-ml-py==13.615.71
fi
for _ in 1 2; do sleep 3600 & sleepers+=("$!"); done  # the GPU's two processes

FAKE_NVML_PIDS=$(IFS=,; echo "${sleepers[*]}") LD_LIBRARY_PATH="$work" \
    .venv/bin/python bench/console/console_nvitop.py --terminal pty --seconds "${SECONDS_MEASURED:-60}" \
    --warmup "${WARMUP:-15}" --nvitop-path "$work/nvitop" --out "$OUT"
