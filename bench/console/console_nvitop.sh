#!/usr/bin/env bash
# bench/console/console_nvitop.py on a GPU machine: tuiprof (embedded agent), tuiprof connect + agentd
# and nvitop side by side at 1 s, under a light matmul load on every GPU. Needs the wheels
# in $WHEELS (textual & co, grpcio, protobuf, msgspec; nvitop and its nvidia-ml-py under nv/),
# see bench/console/console_nvitop.md. Results in $OUT: log.txt, and per terminal (pty, tmux) an archive
# of result.json, the viewers' screens and agentd.log. PROFILE=1: then, under the same load,
# a thread wakeup's CPU (bench/console/wakeup_cost.py), NVML's per-call costs (bench/console/nvml_call_cost.py, beside
# the load) and bench/console/console_cpu_profile.py's
# per-thread CPU and py-spy profile (C functions included) of the embedded and connect consoles
# and of nvitop (in log.txt); PROFILE_ONLY and PROFILE_FLAGS (default --profile --native) choose others.
# TERMINALS= (empty): the profile alone.
set -u
OUT=${OUT:-bench/.work/console_nvitop}
WHEELS=${WHEELS:-.whl-h12}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PIP=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)
"${PIP[@]}" --target /tmp/site "$WHEELS"/*.whl || exit 1
"${PIP[@]}" --target /tmp/nvitop "$WHEELS"/nv/*.whl || exit 1  # nvitop apart: its own nvidia-ml-py
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L; echo "cpus $(nproc)"; uname -r
tmux -V
python3 -c 'import sys, textual, grpc, google.protobuf, pynvml; print(sys.version.split()[0], "textual", textual.__version__, "grpc", grpc.__version__, "protobuf", google.protobuf.__version__)'
PYTHONPATH=/tmp/nvitop python3 -m nvitop --version
python3 setup.py -q build_ext --inplace 2>&1 | tail -3
ls tuiprof_native/*.so || exit 1

SECONDS_MEASURED=${SECONDS_MEASURED:-60} WARMUP=${WARMUP:-15}
TERMINAL_COUNT=$(wc -w <<< "${TERMINALS-pty tmux}")
PROFILE_SECONDS=$([ -n "${PROFILE:-}" ] && echo 320 || echo 0)
python3 - $((TERMINAL_COUNT * (SECONDS_MEASURED + WARMUP) + PROFILE_SECONDS + 40)) <<'PY' &
# Light load on every GPU: bursts of bf16 matmuls, then a pause, so the viewers show busy GPUs.
import sys, threading, time
import torch
def load(device: int, until: float) -> None:
    a = torch.randn(4096, 4096, device=f"cuda:{device}", dtype=torch.bfloat16)
    while time.time() < until:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize(device)
        time.sleep(0.02)
until = time.time() + float(sys.argv[1])
threads = [threading.Thread(target=load, args=(d, until)) for d in range(torch.cuda.device_count())]
[t.start() for t in threads]; [t.join() for t in threads]
PY
LOAD=$!
sleep 5
nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used --format=csv
RC=0
for TERMINAL in ${TERMINALS-pty tmux}; do  # one after the other, same load; each run's files as one archive
  echo "== $TERMINAL"
  python3 bench/console/console_nvitop.py --terminal "$TERMINAL" --seconds "$SECONDS_MEASURED" --warmup "$WARMUP" \
    --nvitop-path /tmp/nvitop --out "/tmp/console_nvitop/$TERMINAL" || RC=1
  tar -czf "$OUT/$TERMINAL.tar.gz" -C /tmp/console_nvitop "$TERMINAL"
done
if [ -n "${PROFILE:-}" ]; then  # NVML's calls alone, then 3 x (10 s warm-up, 40 s measured, 40 s py-spy)
  echo "== wakeups"
  python3 bench/console/wakeup_cost.py --seconds 10 || RC=1
  echo "== NVML calls"
  python3 bench/console/nvml_call_cost.py --reps 100 | tee "$OUT/nvml_call_cost.json" || RC=1
  echo "== profile"
  PATH=/tmp/site/bin:$PATH python3 bench/console/console_cpu_profile.py --only "${PROFILE_ONLY:-embedded,connect,nvitop}" \
    --seconds 40 --warmup 10 ${PROFILE_FLAGS---profile --native} --rate 250 --top 40 --nvitop-path /tmp/nvitop || RC=1
fi
nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used --format=csv
kill $LOAD 2>/dev/null
exit $RC
