"""A non-root user's console traces their own `tuiprof run` job, with no root agent (issue 25 item 6).

All real, in private namespaces (loopback, /tmp and /run of their own; no agent on the agent port), as
the unprivileged user tuiprof-hostile: the console's embedded agent started as `tuiprof` starts it, a
torch 2.13 CPU job under `tuiprof run`, a capture through the console's agent. And what must not
happen: a job pointed at a folder another user made (played by uid 4242, which has no account), or at
a console that is gone; a second console of the same user taking the first one's socket.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
import subprocess
from collections.abc import Callable, Iterator

import pytest

from hostile.conftest import PYTHON, wait_ready
from testkit.agents import stop_process
from testkit.containers import private_tmp_steps
from testkit.namespaces import NEEDED_BY_OTHERS, Namespace, User
from testkit.traces import TRAINER, wait_registered

pytestmark = pytest.mark.slow

OTHER = User("uid 4242", 4242, 4242)  # another local user, who tries to make the user's console folder first
# The console's embedded agent, as the console starts it (tuiprof.client.sources.LocalSource), logging to
# stderr; it serves gRPC at once (the console does from its first capture) and stops when told.
CONSOLE = """
import sys
from agentd.embedded import start_embedded_agent
from agentd.logs import configure_logging
configure_logging("text")
agent = start_embedded_agent(interval_ms=200, pmu_when_shown=True, console_kineto_folder=True)
agent.serve_grpc()
print("ready", flush=True)
print(agent.address.port, flush=True)
sys.stdin.readline()
agent.stop()
"""
PRINT_KINETO = "import os; print(os.environ.get('KINETO_USE_DAEMON'), os.environ.get('KINETO_IPC_SOCKET_DIR'))"
# As OTHER: the user's /tmp place made first, open to all, with a live socket where the console's would be.
SQUAT = """
import os, socket, sys, time
base = sys.argv[1]
for folder in (base, base + "/kineto"):
    os.mkdir(folder)
    os.chmod(folder, 0o777)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(base + "/kineto/dynolog")
os.chmod(base + "/kineto/dynolog", 0o777)
print("ready", flush=True)
time.sleep(600)
"""
REGISTER_SECONDS = 60.0
NO_CONSOLE = ("tuiprof run: on-demand traces of this job are off: no agentd answers on port 1779, and no tuiprof "
              "console of yours is running (for them, start `tuiprof` (your console) before the job, or have root "
              "run agentd); KINETO_ONDEMAND_TRACE_DIR and KINETO_USE_DAEMON not set")


@dataclasses.dataclass
class Console:
    """A console's embedded agent, running as the user in the namespace."""

    process: subprocess.Popen[str]
    port: int
    log_path: pathlib.Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def socket(self) -> str:
        """Where its Kineto endpoint listens (from its log)."""
        for line in self.log().splitlines():
            if "Kineto IPC endpoint listening" in line:
                return line.rpartition("socket=")[2]
        raise AssertionError(f"no Kineto endpoint:\n{self.log()}")

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        assert self.process.wait(30) == 0, self.log()


@pytest.fixture
def inside(namespace: Namespace) -> Callable[[str], pathlib.Path]:
    """Fresh /tmp and /run in the namespace (this checkout and interpreter kept at their paths when they are
    under /tmp, as a clone in /tmp is); a path in there, as this process (root, outside) reaches it."""
    for steps in (private_tmp_steps(NEEDED_BY_OTHERS), ["mount -t tmpfs -o mode=0755 tmpfs /run"]):
        done = namespace.run(["sh", "-c", " && ".join(steps)])
        assert done.returncode == 0, done.stderr
    return lambda path: pathlib.Path(f"/proc/{namespace.holder.pid}/root") / path.lstrip("/")


def user_env(namespace: Namespace, user: User, **extra: str) -> dict[str, str]:
    """The user's environment: HOME=/tmp, none of this process's Kineto or XDG variables, plus ``extra``."""
    env = {k: v for k, v in namespace.env(user).items() if not k.startswith(("KINETO_", "XDG_"))}
    return env | extra


@pytest.fixture
def start_console(namespace, hostile_user, inside, tmp_path) -> Iterator[Callable[..., Console]]:
    consoles: list[Console] = []

    def start(**env: str) -> Console:
        log_path = tmp_path / f"console-{len(consoles)}.log"
        with open(log_path, "w") as log_file:
            process = namespace.popen([PYTHON, "-c", CONSOLE], user=hostile_user, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=log_file, text=True,
                                      env=user_env(namespace, hostile_user, **env))
        console = Console(wait_ready(process), 0, log_path)
        consoles.append(console)
        assert process.stdout is not None
        console.port = int(process.stdout.readline())
        return console

    yield start
    for console in consoles:
        stop_process(console.process)


def tuiprof_run(namespace: Namespace, user: User, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return namespace.run([PYTHON, "-m", "tuiprof.cli", "run", "--", *command], user=user,
                         env=user_env(namespace, user, **env))


def run_lines(stderr: str) -> list[str]:
    """What `tuiprof run` itself said (a job's own warnings left out)."""
    return [line for line in stderr.splitlines() if line.startswith("tuiprof run:")]


def assert_users_own(path: pathlib.Path, user: User) -> None:
    info = path.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == user.uid and stat.S_IMODE(info.st_mode) == 0o700, \
        (path, info)


def test_a_users_tuiprof_run_job_is_traced_through_their_console(namespace, hostile_user, inside, start_console,
                                                                 tmp_path):
    user = hostile_user
    console = start_console()
    folder = f"/tmp/tuiprof-{user.uid}/kineto"
    assert console.socket() == f"{folder}/dynolog"
    assert_users_own(inside(f"/tmp/tuiprof-{user.uid}"), user)
    assert_users_own(inside(folder), user)
    inside("/tmp/kineto-base.conf").write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")  # a 1 s poll period

    job_stderr = tmp_path / "job.err"
    with open(job_stderr, "w") as stderr:
        job = namespace.popen([PYTHON, "-m", "tuiprof.cli", "run", "--", PYTHON, TRAINER, "--seconds", "120"],
                              user=user, stdout=subprocess.PIPE, stderr=stderr, text=True,
                              env=user_env(namespace, user, KINETO_CONFIG="/tmp/kineto-base.conf"))
    try:
        wait_ready(job)
        assert run_lines(job_stderr.read_text()) == [
            f"tuiprof run: on-demand traces of this job go through your tuiprof console (Kineto folder {folder}) "
            "while one of yours runs"]
        environ = dict(entry.split("=", 1) for entry in
                       pathlib.Path(f"/proc/{job.pid}/environ").read_text().split("\0") if "=" in entry)
        assert (environ["KINETO_USE_DAEMON"], environ["KINETO_IPC_SOCKET_DIR"]) == ("1", folder)
        assert environ["KINETO_ONDEMAND_TRACE_DIR"] == "/tmp/.local/state/tuiprof/traces"  # the console's
        wait_registered(console, job.pid, REGISTER_SECONDS)

        traced = namespace.run([PYTHON, "-m", "tuiprof.cli", "trace", f"127.0.0.1:{console.port}", "--duration-ms",
                                "500", "--pids", str(job.pid), "--output", "/tmp/fetched", "--start-delay-ms", "5000",
                                "--fetch", "all", "--json"], user=user, env=user_env(namespace, user), timeout=120)
        assert traced.returncode == 0, traced.stdout + traced.stderr + job_stderr.read_text()[-3000:]
        [host] = json.loads(traced.stdout)["hosts"]
        [target] = host["targets"]
        assert (target["pid"], target["state"]) == (job.pid, "written"), target
        trace = json.loads(inside(target["local"]).read_text())
        ops = {event["name"] for event in trace["traceEvents"] if event.get("cat") == "cpu_op"}
        assert {"aten::mm", "aten::linear"} <= ops, sorted(ops)[:20]
        assert job.poll() is None

        console.stop()  # its socket goes, the folder and the job's own client socket stay
        names = [path.name for path in inside(folder).iterdir()]
        assert "dynolog" not in names and any(name.startswith("dynoconfigclient") for name in names), names
    finally:
        stop_process(job)


def test_without_a_console_tuiprof_run_says_what_to_start(namespace, hostile_user, inside):
    done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO)
    assert (done.returncode, done.stdout.strip()) == (0, "None None"), done.stderr
    assert run_lines(done.stderr) == [NO_CONSOLE], done.stderr


def test_another_users_folder_is_never_the_users_console_folder(namespace, hostile_user, inside, start_console):
    base = f"/tmp/tuiprof-{hostile_user.uid}"
    squatter = wait_ready(namespace.popen([PYTHON, "-c", SQUAT, base], user=OTHER, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    try:
        refused = f"{base} belongs to uid {OTHER.uid}, not to user {hostile_user.name} (uid {hostile_user.uid})"
        console = start_console()  # falls back to a private folder, and says why
        assert console.socket().startswith("/tmp/tuiprof-kineto-"), console.log()
        [warning] = [line for line in console.log().splitlines() if "your console folder cannot be used" in line]
        assert refused in warning, warning
        # The job is not pointed at the other user's live socket, and is told why.
        done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO)
        assert (done.returncode, done.stdout.strip()) == (0, "None None"), done.stderr
        [line] = run_lines(done.stderr)
        assert f"your console folder cannot be used ({refused})" in line, line
        assert line.endswith("KINETO_USE_DAEMON not set"), line
    finally:
        stop_process(squatter)


def test_a_second_console_leaves_the_first_ones_socket_and_a_dead_ones_is_taken_over(namespace, hostile_user,
                                                                                    inside, start_console):
    folder = f"/tmp/tuiprof-{hostile_user.uid}/kineto"
    first = start_console()
    assert first.socket() == f"{folder}/dynolog"
    second = start_console()
    assert second.socket().startswith("/tmp/tuiprof-kineto-"), second.log()
    assert "another console of yours serves your console folder" in second.log()
    second.stop()
    done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO)
    assert done.stdout.split() == ["1", folder], done.stderr  # the first one still serves it

    first.process.kill()  # no stop: its socket file stays, and nothing holds it
    first.process.wait(10)
    assert stat.S_ISSOCK(inside(f"{folder}/dynolog").lstat().st_mode)
    done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO)
    assert done.stdout.strip() == "None None" and run_lines(done.stderr) == [NO_CONSOLE], done.stderr

    third = start_console()
    assert third.socket() == f"{folder}/dynolog"
    done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO)
    assert done.stdout.split() == ["1", folder], done.stderr


def test_the_runtime_dir_comes_first_whether_or_not_a_session_names_it(namespace, hostile_user, inside,
                                                                      start_console):
    runtime = f"/run/user/{hostile_user.uid}"
    inside("/run/user").mkdir(mode=0o755)
    inside(runtime).mkdir(mode=0o700)
    os.chown(inside(runtime), hostile_user.uid, hostile_user.gid)
    console = start_console()  # no XDG_RUNTIME_DIR (su -, cron): logind's path all the same
    assert console.socket() == f"{runtime}/tuiprof/kineto/dynolog"
    assert_users_own(inside(f"{runtime}/tuiprof/kineto"), hostile_user)
    for env in ({}, {"XDG_RUNTIME_DIR": runtime}):
        done = tuiprof_run(namespace, hostile_user, PYTHON, "-c", PRINT_KINETO, **env)
        assert done.stdout.split() == ["1", f"{runtime}/tuiprof/kineto"], done.stderr
    assert not inside(f"/tmp/tuiprof-{hostile_user.uid}").exists()
