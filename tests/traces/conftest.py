"""Fixtures for the trace tests: a real agentd whose Kineto endpoint listens in a private socket dir."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from testkit.agents import RunningAgent, running_agent


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
