#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (apt packages,
# a virtual environment with the package and its test extra) and runs the tests.
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/agent -k prometheus`.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# build tools for the Cython modules and the C hook library; tmux for the terminal
# tests; munge + slurm for the SLURM tests; prometheus (with promtool) and
# node_exporter for the metrics tests and the benchmark peer; util-linux (unshare,
# nsenter, setpriv) and iproute2 for the hostile-user tests' namespaces; the Rust crates
# that build dynolog's `dyno` CLI offline for tests/traces/test_dyno_cli.py.
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential python3-dev python3-venv git tmux procps util-linux iproute2 ethtool \
    munge slurm-wlm prometheus prometheus-node-exporter \
    librust-clap-3-dev librust-serde-json-dev librust-anyhow-dev >/dev/null

# The hostile-local-user tests (tests/hostile) act as this second, unprivileged account;
# without root they are skipped with that reason.
if [ "$(id -u)" -eq 0 ] && ! id tuiprof-hostile >/dev/null 2>&1; then
    useradd -M -s /usr/sbin/nologin tuiprof-hostile
fi

python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/pytest "$@"
