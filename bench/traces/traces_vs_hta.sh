#!/bin/bash
# Start-up-bound case of bench/traces/traces_vs_hta.md: `tuiprof analyze FILE --json` beside HTA on the smallest corpus
# files with GPU events, each a fresh process timed with bash's `time`, RUNS runs per side taking turns.
#
#   bench/traces/traces_vs_hta.sh [RUNS] [TREE...]
#
# TREE: tuiprof source trees to time (default: this one), run as `python -m tuiprof.cli` from the tree's root
# with this checkout's .venv; give an older commit's `git archive` too for a before/after in one run.
# HTA: HTA_PYTHON (default /work/hta-venv/bin/python) runs bench/traces/traces_vs_hta.py's HTA_SCRIPT on a folder
# holding the file. Prints, per file and side, the fastest run and the median (seconds).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=$root/.venv/bin/python
hta_python=${HTA_PYTHON:-/work/hta-venv/bin/python}
runs=${1:-10}
shift || true
trees=("${@:-$root}")
files=(kineto_tb_plugin_2021.json.gz hta_rocm62_mi250.json.gz hta_alexnet.json.gz)
hta_script=$("$python" -c "import sys; sys.path.insert(0, '$root/bench/traces'); import traces_vs_hta; print(traces_vs_hta.HTA_SCRIPT)")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
TIMEFORMAT=%R

summary() {  # the fastest and the median of the times in file $1
  "$python" -c "import statistics, sys; t = [float(x) for x in open(sys.argv[1])]; print(f'{min(t):.3f} (median {statistics.median(t):.3f})')" "$1"
}

echo "load $(cut -d' ' -f1-3 /proc/loadavg); $runs runs per side"
for file in "${files[@]}"; do
  folder=$scratch/${file%.json.gz}
  mkdir -p "$folder"
  cp "$root/tests/traces/data/corpus/$file" "$folder/"
  for run in $(seq "$runs"); do
    for i in "${!trees[@]}"; do
      { time (cd "${trees[$i]}" && "$python" -m tuiprof.cli analyze "$folder/$file" --json >/dev/null); } 2>>"$scratch/tuiprof$i"
    done
    { time "$hta_python" -c "$hta_script" "$folder" >/dev/null 2>&1; } 2>>"$scratch/hta"
  done
  for i in "${!trees[@]}"; do
    echo "$file tuiprof ${trees[$i]}: $(summary "$scratch/tuiprof$i")"
  done
  echo "$file HTA: $(summary "$scratch/hta")"
  rm -f "$scratch"/tuiprof* "$scratch/hta"
done
