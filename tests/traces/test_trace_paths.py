"""Files stay under the trace dir: requests that try to leave it, or to put anything but a plain name
into a file name or a Kineto config, are refused with INVALID_ARGUMENT."""

from __future__ import annotations

import os

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import open_channel

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("subdir", ["../escape", "/tmp/elsewhere", "a/b", "..", "y\nACTIVITIES_LOG_FILE=/tmp/x.json",
                                    "x" * 65, "sp ace", "é"])
async def test_capture_output_subdir_that_is_not_a_plain_name_is_refused(agent, subdir):
    async with open_channel(agent.address) as channel:
        stub = pb_grpc.AgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.CaptureTrace(pb.CaptureTraceRequest(duration_ms=500, output_subdir=subdir))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output_subdir" in raised.value.details() and "plain name" in raised.value.details()
    assert "\n" not in raised.value.details()


# "{own}": the caller's own folder (uid/), where a user may fetch at all: the link and the unfinished file
# are refused for what they are, not for being another user's.
@pytest.mark.parametrize("path", ["../agentd.log", "/etc/passwd", "{own}/link-out/secret", "{own}/x.pt.trace.json.tmp",
                                  "d/" * 300 + "x.json", "x" * 5000, "a\nb"])
async def test_fetch_outside_trace_dir_or_unfinished_is_refused(agent, tmp_path, path):
    own = agent.trace_dir / str(os.getuid())
    own.mkdir(exist_ok=True)
    (tmp_path / "secret").write_text("not for clients")
    (own / "link-out").unlink(missing_ok=True)
    (own / "link-out").symlink_to(tmp_path)
    (own / "x.pt.trace.json.tmp").write_text("{")
    async with open_channel(agent.address) as channel:
        stub = pb_grpc.AgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in stub.FetchFile(pb.FetchFileRequest(path=path.replace("{own}", str(os.getuid())))):
                pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details()
    assert str(agent.trace_dir) not in details and len(details) < 300 and "\n" not in details


async def test_fetch_streams_a_finished_file_from_an_offset(agent):
    payload = bytes(range(256)) * 9000  # > 2 chunks
    own = str(os.getuid())  # the caller's own folder: root's as a user's
    (agent.trace_dir / own).mkdir(exist_ok=True)
    (agent.trace_dir / own / "done.json").write_bytes(payload)
    async with open_channel(agent.address) as channel:
        stub = pb_grpc.AgentStub(channel)
        chunks = [c async for c in stub.FetchFile(pb.FetchFileRequest(path=f"{own}/done.json", offset=10))]
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            async for _ in stub.FetchFile(pb.FetchFileRequest(path=f"{own}/nope.json")):
                pass
    assert b"".join(c.data for c in chunks) == payload[10:]
    assert {c.total_size for c in chunks} == {len(payload)}
    assert chunks[0].offset == 10
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_capture_without_span_is_invalid(agent):
    async with open_channel(agent.address) as channel:
        stub = pb_grpc.AgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.CaptureTrace(pb.CaptureTraceRequest())
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.GetCaptureStatus(pb.CaptureStatusRequest(capture_id="nope"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "duration_ms or iterations" in raised.value.details()
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_agent_reports_its_kineto_endpoint(agent, socket_dir):
    async with open_channel(agent.address) as channel:
        info = await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest())
    [kineto] = [c for c in info.collectors if c.name == "kineto"]
    assert kineto.available, kineto.reason
    assert (socket_dir / "dynolog").is_socket()
    assert "Kineto IPC endpoint listening" in agent.log() and str(socket_dir / "dynolog") in agent.log()
