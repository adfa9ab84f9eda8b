"""`tuiprof run` points KINETO_ONDEMAND_TRACE_DIR at the local agent's trace dir (newer Kineto
writes on-demand traces only under /tmp or that dir), and never fails when no agent answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testkit.agents import running_agent
from testkit.ports import free_port
from tuiprof.commands.run import TRACE_DIR_ENV, agent_folders, launch_environment

PRINT_DIR = f"import os; print(os.environ.get({TRACE_DIR_ENV!r}))"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (TRACE_DIR_ENV, "TUIPROF_TOKEN")}


def tuiprof_run(port: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", "run", "--agent-port", str(port), "--",
                           sys.executable, "-c", PRINT_DIR],
                          capture_output=True, text=True, env=env, timeout=60)


def test_launch_environment_sets_the_trace_dir_unless_the_user_did():
    assert launch_environment({}, trace_dir="/srv/traces")[TRACE_DIR_ENV] == "/srv/traces"
    assert launch_environment({TRACE_DIR_ENV: "/mine"}, trace_dir="/srv/traces")[TRACE_DIR_ENV] == "/mine"
    assert TRACE_DIR_ENV not in launch_environment({}, trace_dir=None)
    assert TRACE_DIR_ENV not in launch_environment({}, kineto_daemon=False, trace_dir="/srv/traces")


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with running_agent(tmp_path_factory.mktemp("rundir")) as running:
        yield running


def test_the_command_gets_the_agents_trace_dir(agent):
    done = tuiprof_run(agent.port, clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == os.path.realpath(agent.trace_dir)


def test_a_users_trace_dir_stands(agent):
    done = tuiprof_run(agent.port, clean_env() | {TRACE_DIR_ENV: "/elsewhere"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/elsewhere"


def test_no_agent_leaves_it_unset_in_one_line():
    port = free_port()
    started = time.monotonic()
    assert agent_folders(port) == (None, "")
    assert time.monotonic() - started < 1.5  # refused at once: no waiting for a timeout
    done = tuiprof_run(port, clean_env())
    assert (done.returncode, done.stdout.strip()) == (0, "None")
    # The one line says what to start for on-demand traces: root, agentd; a user, their console or a root
    # agentd (tests/hostile/test_console_kineto.py has a user's console that serves the job).
    if os.geteuid() == 0:
        why, start = "", "start agentd first"
    else:
        why, start = (", and no tuiprof console of yours is running",
                      "start `tuiprof` (your console) before the job, or have root run agentd")
    assert done.stderr == (f"tuiprof run: on-demand traces of this job are off: no agentd answers on port {port}{why} "
                           f"(for them, {start}); {TRACE_DIR_ENV} and KINETO_USE_DAEMON not set\n")


def test_an_agent_that_wants_a_token(tmp_path):
    """A local caller is known by the kernel's uid for its socket, so it needs no token (agentd.auth);
    a wrong token is still refused."""
    with running_agent(tmp_path, token="s3cret-token") as guarded:
        local = tuiprof_run(guarded.port, clean_env())
        assert local.stdout.strip() == os.path.realpath(guarded.trace_dir), local.stderr
        wrong = tuiprof_run(guarded.port, clean_env() | {"TUIPROF_TOKEN": "not-the-token"})
        assert (wrong.returncode, wrong.stdout.strip()) == (0, "None")
        assert "UNAUTHENTICATED" in wrong.stderr and TRACE_DIR_ENV in wrong.stderr
        allowed = tuiprof_run(guarded.port, clean_env() | {"TUIPROF_TOKEN": "s3cret-token"})
        assert allowed.stdout.strip() == os.path.realpath(guarded.trace_dir), allowed.stderr
