"""`tuiprof run` takes a trace dir only from a real agent: a listener of root or the caller, a folder no one else can change.

The incident: with agentd down, a local user listened on 127.0.0.1:1779, answered
GetInfo with a trace dir of their choosing, root's `tuiprof run` pointed
KINETO_ONDEMAND_TRACE_DIR there and the root trainer overwrote a root-owned file.
Here a real gRPC server answers GetInfo, started as a second user
(tuiprof-hostile, through setpriv) or as the caller, and the kernel's socket
owner (agentd.peer) decides.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testkit.ports import free_port
from testkit.traces import as_user, hostile_user
from tuiprof.commands.run import TRACE_DIR_ENV, agent_folders, report_unusable

FAKE_AGENT = """
import asyncio, sys
import grpc
from agentd.proto import tuiprof_agent_pb2 as pb, tuiprof_agent_pb2_grpc as pb_grpc

class Fake(pb_grpc.AgentServicer):
    async def GetInfo(self, request, context):
        return pb.AgentInfo(hostname="fake", trace_dir=sys.argv[2])

async def main():
    server = grpc.aio.server()
    pb_grpc.add_AgentServicer_to_server(Fake(), server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""
PRINT_DIR = f"import os; print(os.environ.get({TRACE_DIR_ENV!r}))"


@contextlib.contextmanager
def fake_agent(trace_dir: str, user: tuple[int, int] | None = None) -> Iterator[int]:
    """A gRPC server on a free loopback port answering GetInfo with ``trace_dir``, run as ``user``."""
    port = free_port()
    command = [sys.executable, "-c", FAKE_AGENT, str(port), trace_dir]
    process = subprocess.Popen(as_user(user, command) if user else command, cwd="/",
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready", process.stderr
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def tuiprof_run(port: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (TRACE_DIR_ENV, "TUIPROF_TOKEN")}
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", "run", "--agent-port", str(port), "--",
                           sys.executable, "-c", PRINT_DIR], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def safe_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder only the caller can change (what a real agent's trace dir looks like)."""
    folder = tmp_path / "traces"
    folder.mkdir(mode=0o755)
    return folder


def test_a_listener_of_the_caller_naming_a_safe_folder_is_trusted(safe_dir):
    with fake_agent(str(safe_dir)) as port:
        done = tuiprof_run(port)
    assert (done.returncode, done.stdout.strip()) == (0, str(safe_dir.resolve()))
    # This stand-in agent offers no private Kineto folder: daemon mode stays off, in one line (issue 24 item 1).
    assert done.stderr.count("\n") == 1 and "KINETO_USE_DAEMON not set" in done.stderr, done.stderr


def test_another_users_listener_is_not_trusted_even_with_a_safe_folder(safe_dir):
    user = hostile_user()
    with fake_agent(str(safe_dir), user) as port:
        done = tuiprof_run(port)
    assert (done.returncode, done.stdout.strip()) == (0, "None")
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} is served by a process of user tuiprof-hostile (uid {user[0]})" in lines[0]
    assert lines[0].endswith(f"{TRACE_DIR_ENV} and KINETO_USE_DAEMON not set")


def test_a_folder_other_users_can_change_is_refused(tmp_path, capsys):
    uid, gid = hostile_user()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, uid, gid)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    inside_theirs = theirs / "traces"
    inside_theirs.mkdir(mode=0o755)  # root's folder, but its parent is the other user's: they can swap it
    link = tmp_path / "link"
    link.symlink_to(theirs)
    cases = {
        theirs: f"{theirs} belongs to user tuiprof-hostile",
        open_to_all: f"{open_to_all} is writable by other users (mode drwxrwxrwx)",
        inside_theirs: f"{theirs} belongs to user tuiprof-hostile",
        link: f"{theirs} belongs to user tuiprof-hostile",  # the folder the link resolves to is checked
        tmp_path / "missing": "cannot be read: No such file or directory",
    }
    for folder, reason in cases.items():
        with fake_agent(str(folder)) as port:
            folders, problem = agent_folders(port)
        assert folders is not None and folders.trace_dir is None and not problem, (folders, problem)
        report_unusable(folders, {"KINETO_USE_DAEMON": "1"})  # the Kineto folder's line is another test's
        err = capsys.readouterr().err
        assert reason in err and err.count("\n") == 1 and err.strip().endswith(f"{TRACE_DIR_ENV} not set"), err


def test_the_agent_is_asked_with_the_token_file_the_other_commands_take(tmp_path, safe_dir):
    loose = tmp_path / "token"
    loose.write_text("s3cret\n")
    loose.chmod(0o644)
    with fake_agent(str(safe_dir)) as port:
        done = subprocess.run([sys.executable, "-m", "tuiprof.cli", "run", "--agent-port", str(port),
                               "--token-file", str(loose), "--", "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"token file {loose} is readable by every user" in done.stderr
