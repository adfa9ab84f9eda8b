"""What a user inside the test namespace does to the agent; one JSON document on stdout.

Run as root or as the hostile user (tests/testkit/namespaces.py), e.g.

    python tests/hostile/client.py --port 1779 stacks --pids 123
    python tests/hostile/client.py --port 1779 snapshot --rank-pid 123 --with-exception
    python tests/hostile/client.py --port 1779 fetch-race --path 1001/real/shadow --seconds 2
    python tests/hostile/client.py --port 1779 function-timing --pid 123 --start json@dumps

gRPC errors are part of the answer (``{"code": "PERMISSION_DENIED", "details": ...}``),
so a test asserts on a refusal the same way as on a reply.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time

import grpc
from google.protobuf import json_format

from agentd import peer
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc


def _call(function, *args, **kwargs) -> dict:
    try:
        reply = function(*args, **kwargs)
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    return {"code": "OK", "reply": json_format.MessageToDict(reply)}


def info(stub, args) -> dict:
    return _call(stub.GetInfo, pb.GetInfoRequest(), timeout=args.timeout)


def snapshot(stub, args) -> dict:
    """The first snapshot listing ``--rank-pid`` (with a non-empty exception if asked, as root sees it)."""
    deadline = time.monotonic() + args.timeout
    try:
        for snap in stub.Watch(pb.WatchRequest(), timeout=args.timeout):
            ranks = [r for r in snap.ranks if r.pid == args.rank_pid]
            if ranks and (not args.with_exception or ranks[0].exception):
                return {"code": "OK", "reply": json_format.MessageToDict(snap)}
            if time.monotonic() > deadline:
                break
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    return {"code": "NOT_SEEN", "details": f"no snapshot with rank pid {args.rank_pid}"}


def gpu_processes(stub, args) -> dict:
    """GPU 0's processes (and the GPU's unavailable map) from the first snapshot that lists any."""
    try:
        for snap in stub.Watch(pb.WatchRequest(), timeout=args.timeout):
            if snap.gpus and snap.gpus[0].processes:
                gpu = json_format.MessageToDict(snap.gpus[0], preserving_proto_field_name=True)
                return {"code": "OK", "processes": gpu["processes"], "unavailable": gpu.get("unavailable", {})}
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    return {"code": "NOT_SEEN", "details": "no snapshot with a GPU process"}


def stacks(stub, args) -> dict:
    request = pb.GetStacksRequest(take_now=not args.incident, native=args.native, pids=args.pids)
    return _call(stub.GetStacks, request, timeout=args.timeout)


def function_timing(stub, args) -> dict:
    request = pb.SetFunctionTimingRequest(pid=args.pid, start=args.start, stop=args.stop)
    return _call(stub.SetFunctionTiming, request, timeout=args.timeout)


def many_pids(stub, args) -> dict:
    """``--requests`` GetStacks calls, each naming ``--count`` pids; the codes seen."""
    codes: dict[str, int] = {}
    request = pb.GetStacksRequest(take_now=True, pids=range(1, args.count + 1))
    for _ in range(args.requests):
        code = _call(stub.GetStacks, request, timeout=args.timeout)["code"]
        codes[code] = codes.get(code, 0) + 1
    return {"code": "OK", "codes": codes}


def capture(stub, args) -> dict:
    request = pb.CaptureTraceRequest(duration_ms=args.duration_ms, pids=args.pids, job_id=args.job_id,
                                     output_subdir=args.output_subdir)
    return _call(stub.CaptureTrace, request, timeout=args.timeout)


def _fetched(stub, path: str, timeout: float) -> tuple[str, str]:
    """(gRPC code name, the file's text: "" unless OK) of one FetchFile."""
    try:
        chunks = stub.FetchFile(pb.FetchFileRequest(path=path), timeout=timeout)
        return "OK", b"".join(chunk.data for chunk in chunks).decode(errors="replace")
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()


def fetch(stub, args) -> dict:
    code, text = _fetched(stub, args.path, args.timeout)
    return {"code": code, "text": text} if code == "OK" else {"code": code, "details": text}


def fetch_race(stub, args) -> dict:
    """FetchFile of ``--path`` over and over for ``--seconds``: how often each outcome came
    (a served file counts under its text, a refusal under its code)."""
    outcomes: dict[str, int] = {}
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        code, text = _fetched(stub, args.path, args.timeout)
        key = text if code == "OK" else code
        outcomes[key] = outcomes.get(key, 0) + 1
    return {"code": "OK", "outcomes": outcomes}


def healthz(_stub, args) -> dict:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", args.metrics_port, timeout=args.timeout)
    try:
        connection.request("GET", "/healthz")
        status = connection.getresponse().status
    except OSError as exc:
        return {"code": "UNAVAILABLE", "details": str(exc)}
    finally:
        connection.close()
    return {"code": "OK", "status": status, "seconds": time.monotonic() - started}


def listener_owner(_stub, args) -> dict:
    return {"code": "OK", "uid": peer.tcp_socket_uid(("127.0.0.1", args.port), None)}


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds fixed metadata (the token) to every call."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details):
        return details._replace(metadata=tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", help="send `authorization: Bearer TOKEN` with every call")
    parser.add_argument("--timeout", type=float, default=20.0)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info")
    snap = commands.add_parser("snapshot")
    snap.add_argument("--rank-pid", type=int, required=True)
    snap.add_argument("--with-exception", action="store_true")
    stack = commands.add_parser("stacks")
    stack.add_argument("--pids", type=int, nargs="*", default=[])
    stack.add_argument("--native", action="store_true")
    stack.add_argument("--incident", action="store_true")
    many = commands.add_parser("many-pids")
    many.add_argument("--count", type=int, required=True)
    many.add_argument("--requests", type=int, default=1)
    trace = commands.add_parser("capture")
    trace.add_argument("--pids", type=int, nargs="*", default=[])
    trace.add_argument("--duration-ms", type=int, default=500)
    trace.add_argument("--job-id", default="")
    trace.add_argument("--output-subdir", default="")
    fetched = commands.add_parser("fetch")
    fetched.add_argument("--path", required=True)
    race = commands.add_parser("fetch-race")
    race.add_argument("--path", required=True)
    race.add_argument("--seconds", type=float, required=True)
    health = commands.add_parser("healthz")
    health.add_argument("--metrics-port", type=int, required=True)
    commands.add_parser("listener-owner")
    commands.add_parser("gpu-processes")
    functions = commands.add_parser("function-timing")
    functions.add_argument("--pid", type=int, required=True)
    functions.add_argument("--start", nargs="*", default=[])
    functions.add_argument("--stop", nargs="*", default=[])
    args = parser.parse_args()
    actions = {"info": info, "snapshot": snapshot, "stacks": stacks, "many-pids": many_pids,
               "capture": capture, "fetch": fetch, "fetch-race": fetch_race, "healthz": healthz,
               "listener-owner": listener_owner, "gpu-processes": gpu_processes,
               "function-timing": function_timing}
    with grpc.insecure_channel(f"{args.host}:{args.port}",
                               options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]) as channel:
        if args.token:
            metadata = (("authorization", f"Bearer {args.token}"),)
            channel = grpc.intercept_channel(channel, _Metadata(metadata))
        result = actions[args.command](pb_grpc.AgentStub(channel), args)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
