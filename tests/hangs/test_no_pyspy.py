"""Where py-spy is missing, detection still works and stack requests say why they cannot."""

import sys

import grpc
import pytest

from agentd.auth import Caller
from agentd.hang import pyspy
from agentd.hang.detector import Thresholds
from agentd.hang.service import HangService
from agentd.proto import tuiprof_agent_pb2 as pb


@pytest.fixture
def no_pyspy(tmp_path, monkeypatch):
    """An interpreter path and PATH without a py-spy next to them."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))


def test_find_pyspy_says_how_to_install_it(no_pyspy, tmp_path):
    with pytest.raises(pyspy.PySpyMissing, match="pip install py-spy"):
        pyspy.find_pyspy()


class AbortingContext:
    async def abort(self, code, details):
        raise grpc.aio.AbortError(f"{code.name}: {details}")


async def test_service_without_pyspy_judges_but_refuses_dumps(no_pyspy):
    service = HangService(Thresholds(1, 2), None, "node-a")
    snapshot = pb.HostSnapshot(ranks=[pb.RankStats(pid=1, rank=0, state=pb.RANK_STATE_RUNNING)])
    service.process(snapshot)
    assert snapshot.hang.level == pb.HANG_LEVEL_OK
    (status,) = [c for c in snapshot.collectors if c.name == "stacks"]
    assert not status.available and "pip install py-spy" in status.reason
    with pytest.raises(grpc.aio.AbortError, match="FAILED_PRECONDITION: cannot take stacks: py-spy unusable"):
        await service.get_stacks(pb.GetStacksRequest(take_now=True), AbortingContext(), Caller.local(0))
