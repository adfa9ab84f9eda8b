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
# nsenter, setpriv) and iproute2 for the hostile-user tests' namespaces.
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential python3-dev python3-venv git tmux procps util-linux iproute2 ethtool \
    munge slurm-wlm prometheus prometheus-node-exporter >/dev/null
# tests/traces/test_dyno_cli.py builds dynolog's `dyno` CLI offline from a dynolog checkout's cli/
# ($DYNOLOG_CLI_SRC) with Debian's Rust crates: installed only when that test can run.
if [ -n "${DYNOLOG_CLI_SRC:-}" ]; then
    $SUDO apt-get install -y -qq --no-install-recommends \
        cargo librust-clap-3-dev librust-serde-json-dev librust-anyhow-dev >/dev/null
fi

# The hostile-local-user tests (tests/hostile) act as this second, unprivileged account;
# without root they are skipped with that reason.
if [ "$(id -u)" -eq 0 ] && ! id tuiprof-hostile >/dev/null 2>&1; then
    useradd -M -s /usr/sbin/nologin tuiprof-hostile
fi

python3 -m venv .venv
# PyTorch's CPU build (PyPI's torch==2.13.0 is the CUDA one: 527 MB plus GBs of NVIDIA wheels):
# a local index or wheel folder that has it, else PyTorch's CPU index, else PyPI's as a last resort.
.venv/bin/pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || .venv/bin/pip install -q --timeout 30 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    || .venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/pytest "$@"
