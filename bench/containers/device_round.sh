#!/usr/bin/env bash
# The ranks collector's cost (200 containers × 8 ranks, ranks_cost.py) on a GPU machine's host, this commit against an
# older one taking turns, and how long touching memory left idle a second takes there (idle_memory.py): this VM's
# figures are inflated by the latter (README). Run from a `git archive` of this commit beside one of the older
# commit in ../.clean_old (carry both, and .whl):
#   bash bench/containers/device_round.sh
set -u
. bench/gpu/device_env.sh "${OUT:-bench/.work/containers_device}"
echo "cpus $(nproc) $(uname -r)"; command -v unshare setpriv || exit 1
for tree in . ../.clean_old; do
  (cd $tree && [ -f tuiprof_native/segment.*.so ] || python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -2)
done
python3 bench/containers/idle_memory.py
for round in 1 2; do
  for tree in . ../.clean_old; do
    echo "== $tree round $round $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 240 python3 bench/containers/ranks_cost.py --containers 200 --ranks 8 \
      --seconds "${SECONDS_PER_RUN:-30}" --phases containers | grep -E "^\| containers|^Machine")
  done
done
