"""The stock `dyno` CLI, built from dynolog's own source, against a real agentd and a real PyTorch CPU trainer.

dynolog's code is not part of this repository: set $DYNOLOG_CLI_SRC to the `cli/` folder of a dynolog
checkout. It builds offline with Debian's packaged crates (`librust-clap-3-dev`, `librust-serde-json-dev`,
`librust-anyhow-dev`, which tests/run.sh installs when $DYNOLOG_CLI_SRC is set) through a cargo source
replacement; without any of these the tests are skipped, saying which.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.traces import as_user, hostile_user

DEBIAN_CRATES = pathlib.Path("/usr/share/cargo/registry")
CRATES = ("clap-3", "serde_json-", "anyhow-")
# Kept between runs so a second run only relinks.
TARGET_DIR = pathlib.Path(tempfile.gettempdir()) / "tuiprof-dyno-target"
CARGO_CONFIG = f"""[source.crates-io]
replace-with = "debian"
[source.debian]
directory = "{DEBIAN_CRATES}"
[net]
offline = true
"""
TRACE_TIMEOUT_SECONDS = 90.0


def _cargo() -> str | None:
    return shutil.which("cargo") or next(
        (str(p) for p in [pathlib.Path.home() / ".cargo" / "bin" / "cargo"] if p.is_file()), None)


@pytest.fixture(scope="module")
def dyno(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    source = os.environ.get("DYNOLOG_CLI_SRC", "")
    if not (pathlib.Path(source) / "Cargo.toml").is_file():
        pytest.skip("set DYNOLOG_CLI_SRC to the cli/ folder of a dynolog checkout (dynolog's code is not vendored)")
    cargo = _cargo()
    if cargo is None:
        pytest.skip("no cargo: the Rust toolchain is needed to build dyno")
    missing = [name for name in CRATES if not any(DEBIAN_CRATES.glob(name + "*"))]
    if missing:
        pytest.skip(f"Debian's packaged crates {missing} are not in {DEBIAN_CRATES} "
                    "(apt-get install librust-clap-3-dev librust-serde-json-dev librust-anyhow-dev)")
    build = tmp_path_factory.mktemp("dyno") / "cli"
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("target", ".cargo"))
    (build / ".cargo").mkdir()
    (build / ".cargo" / "config.toml").write_text(CARGO_CONFIG)
    done = subprocess.run([cargo, "build", "--release", "--offline"], cwd=build, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "CARGO_TARGET_DIR": str(TARGET_DIR)})
    assert done.returncode == 0, done.stderr[-3000:]
    TARGET_DIR.chmod(0o755)  # the second local user runs it too
    return TARGET_DIR / "release" / "dyno"


def run(binary: pathlib.Path, port: int, *args: str, user: tuple[int, int] | None = None) -> str:
    """dyno's stdout (default --hostname localhost: ::1 first on Debian); it must exit 0."""
    command = [str(binary), "--port", str(port), *args]
    done = subprocess.run(as_user(user, command) if user else command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def wait_for_trace(path: pathlib.Path) -> dict:
    deadline = time.monotonic() + TRACE_TIMEOUT_SECONDS
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), f"no {path}: {sorted(str(p) for p in path.parent.parent.rglob('*'))}"
    return json.loads(path.read_text())


@pytest.mark.slow
def test_dyno_status_version_dcgm_and_gputrace_by_duration_and_iterations_with_stacks(dyno, dynolog_served):
    agent, port, pid = dynolog_served
    assert 'response = {"status":1}' in run(dyno, port, "status")
    assert 'response = {"version":"tuiprof-agentd' in run(dyno, port, "version")
    # true where agentd paused its GPM sampling (a Hopper or newer GPU), false as dynolog without DCGM elsewhere
    with grpc.insecure_channel(agent.address.target) as channel:
        info = pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)
    paused = "true" if any(gpu.gpm_supported for gpu in info.gpus) else "false"
    assert f'response = {{"status":{paused}}}' in run(dyno, port, "dcgm-pause", "--duration-s", "5")
    assert f'response = {{"status":{paused}}}' in run(dyno, port, "dcgm-resume")
    folder = agent.trace_dir / str(os.getuid())
    by_duration = run(dyno, port, "gputrace", "--log-file", str(folder / "d.json"), "--duration-ms", "500",
                      "--pids", str(pid))
    assert f"Matched 1 processes\nTrace output files will be written to:\n    {folder}/d_{pid}.json" in by_duration
    trace = wait_for_trace(folder / f"d_{pid}.json")  # exactly where dyno said
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    by_iterations = run(dyno, port, "gputrace", "--log-file", str(folder / "i.json"), "--iterations", "2",
                        "--pids", str(pid), "--with-stacks", "--record-shapes")
    assert f"    {folder}/i_{pid}.json" in by_iterations
    trace = wait_for_trace(folder / f"i_{pid}.json")
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"]), "no Python frames with --with-stacks"
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"]), "no shapes with --record-shapes"
    outside = run(dyno, port, "gputrace", "--log-file", "/tmp/elsewhere.json", "--pids", str(pid))
    assert f'"refused":"log file /tmp/elsewhere.json is outside the trace folder of uid {os.getuid()}' in outside
    assert "No processes were matched" in outside


@pytest.mark.slow
def test_a_second_local_users_dyno_cannot_trace_roots_process(dyno, dynolog_served):
    user = hostile_user()
    agent, port, pid = dynolog_served
    out = run(dyno, port, "gputrace", "--log-file", str(agent.trace_dir / str(user[0]) / "x.json"),
              "--pids", str(pid), user=user)
    assert '"activityProfilersTriggered":[]' in out and '"processesMatched":[]' in out
    assert "No processes were matched" in out
    time.sleep(3)  # a few of the trainer's 1 s polls: nothing was handed to it
    assert not any(agent.trace_dir.rglob("x*.json"))
    assert "handed a trace config" not in agent.log()
