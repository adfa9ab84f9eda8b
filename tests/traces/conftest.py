"""Fixtures for the trace tests: a real agentd whose Kineto endpoint listens in a private socket dir."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from agentd.traces.paths import TraceDir
from testkit.agents import RunningAgent, running_agent
from testkit.ports import free_port
from testkit.traces import trainers, wait_registered


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[pathlib.Path]:
    """A short directory for the IPC socket (AF_UNIX paths are limited to 107 bytes);
    private, so other agents on this machine never see these trainers."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, socket_dir: pathlib.Path) -> Iterator[RunningAgent]:
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    with running_agent(tmp_path_factory.mktemp("agent"), env=env) as running:
        yield running


@pytest.fixture
def dynolog_served(tmp_path: pathlib.Path) -> Iterator[tuple[RunningAgent, int, int]]:
    """(agent, its dynolog RPC port, the pid of a real PyTorch trainer polling it)."""
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    rpc_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    try:
        with running_agent(tmp_path, env=env, extra_args=["--dynolog-rpc-port", str(rpc_port)]) as agent, \
                trainers(socket_dir, [None]) as [trainer]:
            wait_registered(agent, trainer.pid)
            yield agent, rpc_port, trainer.pid
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def trace_dir(tmp_path: pathlib.Path) -> TraceDir:
    """An agent's trace dir, prepared as the agent prepares its own (a module may define its own instead)."""
    (tmp_path / "traces").mkdir()
    directory = TraceDir(tmp_path / "traces")
    directory.prepare()
    return directory
