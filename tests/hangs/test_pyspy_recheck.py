"""py-spy installed while the agent runs is found at the next stack request, without a restart."""

import os
import sys

from agentd.auth import Caller
from agentd.hang import pyspy
from agentd.hang.detector import Thresholds
from agentd.hang.service import HangService
from agentd.proto import tuiprof_agent_pb2 as pb


async def test_a_stack_request_looks_for_pyspy_again(tmp_path, monkeypatch):
    real = pyspy.find_pyspy()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    service = HangService(Thresholds(1, 2), None, "node-a")
    before = pb.HostSnapshot()
    service.process(before)
    assert [c.available for c in before.collectors if c.name == "stacks"] == [False]

    os.symlink(real, tmp_path / "py-spy")  # "pip install py-spy" into the agent's environment
    reply = await service.get_stacks(pb.GetStacksRequest(take_now=True), None, Caller.local(0))
    assert reply.hostname == "node-a" and list(reply.ranks) == []
    after = pb.HostSnapshot()
    service.process(after)
    assert [(c.available, c.reason) for c in after.collectors if c.name == "stacks"] == [(True, "")]


def test_pyspy_is_installed_with_the_package_not_only_with_the_test_extra():
    import pathlib
    import tomllib

    project = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("py-spy") for d in project["dependencies"])
