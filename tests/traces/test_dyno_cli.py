"""The stock `dyno` CLI, built from dynolog's own source, against a real agentd and a real PyTorch CPU trainer.

dynolog's code is not part of this repository: set $DYNOLOG_CLI_SRC to the `cli/` folder of a dynolog
checkout. It builds offline with Debian's packaged crates (`librust-clap-3-dev`, `librust-serde-json-dev`,
`librust-anyhow-dev`, which tests/run.sh installs when $DYNOLOG_CLI_SRC is set) through a cargo source
replacement; without any of these the tests are skipped, saying which.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import RunningAgent, running_agent, stop_process
from testkit.ports import free_port
from testkit.traces import TRAINER, as_user, hostile_user, kineto_env, trainers, wait_registered

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


def dyno_run(binary: pathlib.Path, port: int, *args: str,
             user: tuple[int, int] | None = None) -> subprocess.CompletedProcess[str]:
    """``dyno ARGS`` (default --hostname localhost: ::1 first on Debian), as ``user`` when given."""
    command = [str(binary), "--port", str(port), *args]
    return subprocess.run(as_user(user, command) if user else command, capture_output=True, text=True, timeout=60)


def run(binary: pathlib.Path, port: int, *args: str, user: tuple[int, int] | None = None) -> str:
    """dyno's stdout; it must exit 0."""
    done = dyno_run(binary, port, *args, user=user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def wait_for_trace(path: pathlib.Path) -> dict:
    deadline = time.monotonic() + TRACE_TIMEOUT_SECONDS
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), f"no {path}: {sorted(str(p) for p in path.parent.iterdir())}"
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
    # dynolog's documented workflow: a log file anywhere its user may write, written there by the trainer itself
    own = pathlib.Path(tempfile.mkdtemp(prefix="tpdyno", dir="/tmp"))
    try:
        elsewhere = run(dyno, port, "gputrace", "--log-file", f"{own}/libkineto_trace.json", "--pids", str(pid))
        assert f"Trace output files will be written to:\n    {own}/libkineto_trace_{pid}.json" in elsewhere
        wait_for_trace(own / f"libkineto_trace_{pid}.json")
    finally:
        shutil.rmtree(own)
    relative = dyno_run(dyno, port, "gputrace", "--log-file", "libkineto_trace.json", "--pids", str(pid),
                        "--fail-on-no-process")
    assert relative.returncode == 1, (relative.stdout, relative.stderr)
    assert ('"refused":"log file \'libkineto_trace.json\' is relative: give an absolute path (the trainer does not '
            "run in dyno's working directory)\"") in relative.stdout
    assert "No processes were matched" in relative.stdout
    # dyno pastes the path into its JSON unescaped: a control character makes the request no JSON at all, which
    # agentd, as dynolog, does not answer (dyno then panics with exit status 101).
    control = dyno_run(dyno, port, "gputrace", "--log-file", "/tmp/a\x01b.json", "--pids", str(pid))
    assert control.returncode == 101 and "Unable to decode output bytes" in control.stderr
    assert "rpc-bad-json: request is not JSON" in agent.log()


@dataclasses.dataclass
class TwoUsers:
    """A real agent serving the dynolog RPC, and a real PyTorch trainer of root's and one of tuiprof-hostile's
    polling it (through a socket dir both may bind their client sockets in)."""

    agent: RunningAgent
    port: int
    roots: int  # pid of root's trainer
    users: int  # pid of the other user's trainer
    users_stderr: pathlib.Path  # that trainer's stderr, where Kineto says what it could not write


@pytest.fixture
def two_users(tmp_path: pathlib.Path) -> Iterator[TwoUsers]:
    user = hostile_user()
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    socket_dir.chmod(0o777)
    rpc_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"} | {"KINETO_IPC_SOCKET_DIR": str(socket_dir)}
    stderr = tmp_path / "trainer.stderr"
    try:
        with running_agent(tmp_path, env=env, extra_args=["--dynolog-rpc-port", str(rpc_port)]) as agent, \
                trainers(socket_dir, [None]) as [roots], open(stderr, "wb") as errors:
            users = subprocess.Popen(as_user(user, [sys.executable, str(TRAINER), "--seconds", "150"]),
                                     env=kineto_env(socket_dir, HOME=str(socket_dir)), stdout=subprocess.PIPE,
                                     stderr=errors)
            try:
                assert users.stdout is not None and users.stdout.readline().strip() == b"ready"
                wait_registered(agent, roots.pid)
                wait_registered(agent, users.pid)
                yield TwoUsers(agent, rpc_port, roots.pid, users.pid, stderr)
            finally:
                stop_process(users)
                users.stdout.close()
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def users_folder() -> Iterator[pathlib.Path]:
    """A folder outside any trace dir that only tuiprof-hostile may write (0700, theirs)."""
    user = hostile_user()
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tpown", dir="/tmp"))
    os.chown(folder, *user)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def wait_for_line(path: pathlib.Path, text: str) -> None:
    deadline = time.monotonic() + TRACE_TIMEOUT_SECONDS
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in {path}: {path.read_text(errors='replace')[-3000:]}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_second_users_dyno_writes_where_that_user_may_and_traces_no_one_elses_process(dyno, two_users,
                                                                                          users_folder):
    user = hostile_user()
    port, roots, users = two_users.port, two_users.roots, two_users.users
    log_file = f"{users_folder}/libkineto_trace.json"
    other = dyno_run(dyno, port, "gputrace", "--log-file", log_file, "--pids", str(roots), "--fail-on-no-process",
                     user=user)
    assert other.returncode == 1, (other.stdout, other.stderr)
    assert '"activityProfilersTriggered":[]' in other.stdout and '"processesMatched":[]' in other.stdout
    assert "No processes were matched" in other.stdout
    own = run(dyno, port, "gputrace", "--log-file", log_file, "--pids", str(users), user=user)
    assert f"Trace output files will be written to:\n    {users_folder}/libkineto_trace_{users}.json" in own
    wait_for_trace(users_folder / f"libkineto_trace_{users}.json")
    assert (users_folder / f"libkineto_trace_{users}.json").stat().st_uid == user[0]  # written by the trainer
    assert not any(users_folder.glob(f"*_{roots}.json"))
    assert f"handed a trace config to pid {roots} " not in two_users.agent.log()
    # Root may aim any trainer, but the trainer writes as its owner: where that user may not, nothing lands.
    roots_only = pathlib.Path(tempfile.mkdtemp(prefix="tproot", dir="/tmp"))
    try:
        denied = run(dyno, port, "gputrace", "--log-file", f"{roots_only}/t.json", "--pids", str(users))
        assert f'"activityProfilersTriggered":[{users}]' in denied
        wait_for_line(two_users.users_stderr, f"Failed to open '{roots_only}/t_{users}.json' : Permission denied")
        wait_for_line(two_users.users_stderr, "Failed to write to log file!")  # that trace is over
        assert list(roots_only.iterdir()) == []
    finally:
        shutil.rmtree(roots_only)
    by_root = run(dyno, port, "gputrace", "--log-file", f"{users_folder}/by-root.json", "--pids", str(users))
    assert f"    {users_folder}/by-root_{users}.json" in by_root
    wait_for_trace(users_folder / f"by-root_{users}.json")
    assert (users_folder / f"by-root_{users}.json").stat().st_uid == user[0]
