"""The servicer's delegation seam: trace and stacks RPCs go to the providers it is given."""

from __future__ import annotations

import grpc
import pytest

from agentd.agent import Agent
from agentd.auth import CallerIdentifier
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.server import AgentServicer


class RecordingTraces:
    """A trace provider that answers from what it was asked."""

    async def capture_trace(self, request, context):
        return pb.CaptureTraceReply(capture_id=f"cap-{request.duration_ms}")

    async def get_capture_status(self, request, context):
        return pb.CaptureTraceReply(capture_id=request.capture_id, done=True)

    async def fetch_file(self, request, context):
        for offset in (0, 3):
            yield pb.FileChunk(data=request.path.encode()[offset:offset + 3], offset=offset)


async def serve(traces, stacks):
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    callers = CallerIdentifier(token_required=False, port=port)
    pb_grpc.add_AgentServicer_to_server(AgentServicer(Agent([], 1.0), pb.AgentInfo(), callers, traces, stacks), server)
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_without_providers_the_rpcs_answer_unimplemented_with_a_reason():
    server, target = await serve(None, None)
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.AgentStub(channel)
            calls = [
                stub.CaptureTrace(pb.CaptureTraceRequest(duration_ms=10), timeout=5),
                stub.GetCaptureStatus(pb.CaptureStatusRequest(capture_id="x"), timeout=5),
                stub.GetStacks(pb.GetStacksRequest(take_now=True), timeout=5),
            ]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert "not available in this agentd" in caught.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.FetchFile(pb.FetchFileRequest(path="a"), timeout=5):
                    pass
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "file fetch" in caught.value.details()
    finally:
        await server.stop(None)


async def test_with_a_provider_the_rpcs_reach_it():
    server, target = await serve(RecordingTraces(), None)
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.AgentStub(channel)
            assert (await stub.CaptureTrace(pb.CaptureTraceRequest(duration_ms=7), timeout=5)).capture_id == "cap-7"
            status = await stub.GetCaptureStatus(pb.CaptureStatusRequest(capture_id="c1"), timeout=5)
            assert (status.capture_id, status.done) == ("c1", True)
            chunks = [c async for c in stub.FetchFile(pb.FetchFileRequest(path="abcdef"), timeout=5)]
            assert [(c.data, c.offset) for c in chunks] == [(b"abc", 0), (b"def", 3)]
    finally:
        await server.stop(None)
