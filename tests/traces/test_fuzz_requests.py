"""Property tests: whatever a local user sends — Kineto datagrams, CaptureTrace and FetchFile fields,
dynolog RPC bodies — the agent answers or refuses cleanly (a known error, never an escaped exception)
and keeps serving. The datagrams go to a real endpoint socket, the RPCs to a real agentd."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentd.kineto import wire
from agentd.kineto.endpoint import KinetoEndpoint
from agentd.kineto.registry import Registry
from agentd.kineto.rpc import DynologRpc
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.traces import KinetoClient

FRAME_CAUSES = {"truncated", "size-mismatch", "unknown-type", "bad-req", "bad-ctxt"}
CLEAN_CAPTURE_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
# Answers that keep inside the trace dir; PERMISSION_DENIED: another user's folder, to a caller who is not root.
CLEAN_FETCH_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.PERMISSION_DENIED}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

int32 = st.integers(-(2**31), 2**31 - 1)
frames = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda kind, payload: wire.encode(kind, payload), st.sampled_from([b"req", b"ctxt", b"x" * 32, b""]),
              st.binary(max_size=100)),
    st.builds(lambda wants, count, job, pids: wire.encode(
        b"req", struct.pack("<iiq", wants, count, job) + struct.pack(f"<{len(pids)}i", *pids)),
        int32, st.integers(-3, 70), st.integers(-(2**63), 2**63 - 1), st.lists(int32, max_size=70)),
    st.builds(lambda size, kind, payload: struct.pack("<Q32s", size, kind) + payload,
              st.integers(0, 2**64 - 1), st.binary(max_size=32), st.binary(max_size=64)),
)


@given(frames)
def test_any_datagram_decodes_or_is_refused_with_its_cause(datagram):
    try:
        message = wire.parse(datagram)
    except wire.FrameError as exc:
        assert exc.cause in FRAME_CAUSES
    else:
        assert isinstance(message, (wire.PollMessage, wire.ContextMessage))


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[KinetoEndpoint, pathlib.Path]]:
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    served = KinetoEndpoint(Registry(), str(socket_dir))
    yield served, socket_dir
    served.close()
    shutil.rmtree(socket_dir, ignore_errors=True)


@FUZZ
@given(st.lists(frames, min_size=1, max_size=20))
def test_endpoint_keeps_answering_whatever_datagrams_came_before(endpoint, datagrams):
    served, socket_dir = endpoint
    sender, probe = KinetoClient(socket_dir), KinetoClient(socket_dir)
    try:
        for datagram in datagrams:
            sender.send(datagram)
        probe.send(wire.poll_request(wire.WANTS_ACTIVITIES, 0, (os.getpid(),)))
        assert probe.reply() == wire.poll_reply("")
    finally:
        sender.close()
        probe.close()
    assert served._thread.is_alive()


texts = st.one_of(st.just(""), st.just("ok-name"), st.just(""), st.text(max_size=80),
                  st.sampled_from(["..", "a/b", "y\nACTIVITIES_LOG_FILE=/tmp/x.json", "x" * 65]))
# Mostly plausible values, so that about half the requests pass the checks and start a capture.
capture_requests = st.builds(
    lambda kind, span, value, start, pids, ranks, job, subdir, shapes: pb.CaptureTraceRequest(
        kind=kind, start_time_unix_ms=start, pids=pids, ranks=ranks, job_id=job, output_subdir=subdir,
        options=pb.TraceOptions(record_shapes=shapes), **({span: value} if span else {})),
    st.sampled_from([0, 0, 0, 0, 1, 1, 1, 2, 99, -1]),
    st.sampled_from(["duration_ms", "duration_ms", "iterations", "last_events", None]),
    st.one_of(st.integers(1, 2000), st.integers(1, 2000), st.integers(1, 2000), st.integers(0, 2**32 - 1)),
    st.one_of(st.just(0), st.just(0), st.just(0), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.just([]), st.lists(st.integers(1, 4_000_000), max_size=10),
              st.lists(st.integers(0, 2**32 - 1), max_size=10)),
    st.one_of(st.just([]), st.lists(st.integers(0, 16), max_size=10), st.lists(int32, max_size=10)),
    st.one_of(st.just(""), st.just("4242"), texts), texts, st.booleans(),
)


@pytest.fixture(scope="module")
def stub(agent) -> Iterator[pb_grpc.AgentStub]:
    with grpc.insecure_channel(agent.address.target) as channel:
        yield pb_grpc.AgentStub(channel)


def code_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.slow
@FUZZ
@given(capture_requests)
def test_random_capture_requests_are_answered_or_refused_cleanly(stub, request):
    code = code_of(lambda: stub.CaptureTrace(request, timeout=20))
    event(code.name)  # --hypothesis-show-statistics shows how many were answered, how many refused
    assert code in CLEAN_CAPTURE_CODES


@pytest.mark.slow
def test_oversized_lists_are_refused_before_anything_is_queued(stub):
    for request in [pb.CaptureTraceRequest(duration_ms=10, pids=range(1, 4098)),
                    pb.CaptureTraceRequest(duration_ms=10, ranks=range(4097)),
                    pb.CaptureTraceRequest(duration_ms=10, kind=99),
                    pb.CaptureTraceRequest(duration_ms=10, output_subdir="d" * 4000)]:
        with pytest.raises(grpc.RpcError) as refused:
            stub.CaptureTrace(request, timeout=20)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(refused.value.details()) < 300 and "\n" not in refused.value.details()


paths = st.one_of(st.text(max_size=100), st.lists(st.sampled_from(["..", ".", "", "etc", "0", "done.json", "passwd",
                                                                   "timeline", "link", "\n", "/"]),
                                                  max_size=6).map("/".join))


@pytest.mark.slow
@FUZZ
@given(paths)
def test_random_fetch_paths_never_leave_the_trace_dir(agent, stub, path):
    (agent.trace_dir / "done.json").write_bytes(b"inside")
    (agent.trace_dir / "link").unlink(missing_ok=True)
    (agent.trace_dir / "link").symlink_to("/etc")
    try:
        data = b"".join(c.data for c in stub.FetchFile(pb.FetchFileRequest(path=path), timeout=20))
    except grpc.RpcError as exc:
        assert exc.code() in CLEAN_FETCH_CODES, (path, exc.code(), exc.details())
        assert str(agent.trace_dir) not in (exc.details() or "")  # paths relative to the trace dir only
    else:
        assert data == b"inside", path


def _json(value: object) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity included, as Python writes them


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30)
rpc_requests = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: repr(v).encode()),
    st.fixed_dictionaries({"fn": st.sampled_from(["getStatus", "getVersion", "setKinetOnDemandRequest", "x"])},
                          optional={"config": json_values | st.text(max_size=200), "pids": json_values,
                                    "job_id": json_values, "process_limit": json_values,
                                    "token": json_values}).map(_json),
)


@FUZZ
@given(rpc_requests, st.sampled_from([None, 0, 4242]))
def test_random_dynolog_requests_get_a_reply_or_nothing_never_an_exception(tmp_path, body, peer_uid):
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True)
    with socket.socket() as unused:
        rpc = DynologRpc([unused], registry, lambda uid: tmp_path / str(uid), "v")
        answer = rpc.answer(body, peer_uid)
    assert answer is None or isinstance(answer, dict)
    pending = registry.entries()[0].pending
    if pending is not None:  # whatever was asked, the config names only agentd's file, one key per line
        lines = pending.text.splitlines()
        assert lines[0].startswith(f"ACTIVITIES_LOG_FILE={tmp_path}/") and all(line.count("=") == 1 for line in lines)
