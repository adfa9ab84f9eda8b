#!/usr/bin/env bash
# bench/console/console_prometheus.py on the GPU machine's 16 CPU cores (no GPU used): the console over a
# real Prometheus that has cores of its own, against the 2-core VM's runs. Prometheus and promtool
# are Debian's (2.42, as on the VM), carried xz-compressed in $PROM (prometheus.xz, promtool.xz:
# `xz -c /usr/bin/prometheus`); the console's wheels (textual & co, grpcio, protobuf, msgspec) in
# $WHEELS; httpx and psutil are the image's. Arguments go to the bench, e.g.
#   OUT=$OUT bash bench/console/console_prometheus.sh --counts 10000 --rules-only --seconds 120 --warmup 30 \
#     --backfill-s-per-host 0.004
# (about 5 minutes at 10,000 hosts: backfill ~1.5 min, Prometheus's start, 30 + 120 s measured,
# a refresh with new rows every 5 s.) With ANSWER_HOSTS=N, then bench/console/console_prometheus_answer.py
# (the console's own share of a refresh of N hosts; ANSWER_ARGS: its other options, e.g.
# "--new-every 3 --server-ms 460 --probe-ms 80"), over the tree in $BEFORE too when set (e.g. an
# older commit's tuiprof and agentd unpacked with `git archive`). Output in $OUT/log.txt (the
# machine, the versions, one JSON line per measured run).
set -u
OUT=${OUT:-bench/.work/console_prometheus}
WHEELS=${WHEELS:-.whl-console}
PROM=${PROM:-.carry-prom}
mkdir -p "$OUT" /tmp/prom/bin
exec > >(tee "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
  || exit 1
for tool in prometheus promtool; do  # python's lzma: no xz binary needed there
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$PROM/$tool.xz" "/tmp/prom/bin/$tool" && chmod +x "/tmp/prom/bin/$tool" || exit 1
done
export PATH=/tmp/prom/bin:$PATH PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
echo "cpus $(nproc); $(grep -m1 'model name' /proc/cpuinfo); mem $(free -g | awk '/Mem:/ {print $2}') GiB"
prometheus --version 2>&1 | head -1
python3 -c 'import sys, textual, grpc, google.protobuf, msgspec, httpx; print(sys.version.split()[0], "textual", textual.__version__, "grpc", grpc.__version__, "protobuf", google.protobuf.__version__, "msgspec", msgspec.__version__, "httpx", httpx.__version__)'
date -u +%FT%TZ
python3 bench/console/console_prometheus.py "$@"
RC=$?
if [ -n "${ANSWER_HOSTS:-}" ]; then
  for tree in ${BEFORE:-} .; do
    echo "# console's share of a refresh, tuiprof from $tree"
    # shellcheck disable=SC2086  # ANSWER_ARGS: several options
    python3 bench/console/console_prometheus_answer.py --hosts "$ANSWER_HOSTS" --source "$tree" ${ANSWER_ARGS:-} || RC=1
  done
fi
date -u +%FT%TZ
exit $RC
