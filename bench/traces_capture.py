"""Time from `tuiprof trace` start to every file fetched and merged, for 2, 16 and 64 agents.

    .venv/bin/python bench/traces_capture.py [--agents 2,16,64] [--events 20000]

The agents are simulated in one helper process (one gRPC server per agent on
its own loopback port): CaptureTrace reports one rank per agent, whose file is
finished when the traced span ends; FetchFile is agentd's real implementation
(``CaptureService.fetch_file``) streaming a real Kineto-shaped trace from a
trace dir. The CLI runs unchanged (`tuiprof trace HOST… --duration-ms 1000
--start-delay-ms 0 --json`); the figure is its wall time minus the 1 s span.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import subprocess
import sys
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agentd.auth import Caller, set_current_caller  # noqa: E402
from agentd.kineto.registry import Registry  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc  # noqa: E402
from agentd.traces.service import CaptureService  # noqa: E402

WORK = pathlib.Path(__file__).parent / ".work" / "capture"
DURATION_MS = 1000


class SimulatedAgent(pb_grpc.AgentServicer):
    """One rank per agent; its trace is done when the span ends; files served by agentd's FetchFile."""

    def __init__(self, rank: int, trace_dir: pathlib.Path) -> None:
        self.rank = rank
        self.files = CaptureService(trace_dir, f"sim{rank}", Registry())
        self.done_at = 0.0

    async def CaptureTrace(self, request, context):
        self.done_at = request.start_time_unix_ms / 1000 + request.duration_ms / 1000
        return self._reply()

    async def GetCaptureStatus(self, request, context):
        return self._reply()

    async def FetchFile(self, request, context):
        set_current_caller(Caller.token_holder())  # as agentd's servicer does for a call with the token
        async for chunk in self.files.fetch_file(request, context):
            yield chunk

    def _reply(self) -> pb.CaptureTraceReply:
        written = time.time() >= self.done_at
        target = pb.TraceTarget(host=f"sim{self.rank}", pid=1000 + self.rank, rank=self.rank,
                                state="written" if written else "sent", file=f"rank{self.rank}.json")
        return pb.CaptureTraceReply(capture_id="sim", targets=[target], done=written)


async def serve(count: int, trace_dir: pathlib.Path) -> None:
    servers, ports = [], []
    for rank in range(count):
        server = grpc.aio.server()
        pb_grpc.add_AgentServicer_to_server(SimulatedAgent(rank, trace_dir / f"r{rank}"), server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for server in servers:
        await server.stop(0)


def prepare(count: int, events: int) -> pathlib.Path:
    from traces_merge import generate

    directory = WORK / f"{count}x{events}"
    for rank in range(count):
        path = directory / f"r{rank}" / f"rank{rank}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            generate(path, rank, events, seed=rank)
    return directory


def measure(count: int, events: int) -> dict:
    directory = prepare(count, events)
    helper = subprocess.Popen([sys.executable, __file__, "--serve", str(count), str(directory)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(helper.stdout.readline())
        output = WORK / f"out-{count}"
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "tuiprof.cli", "trace", *[f"127.0.0.1:{p}" for p in ports],
                                 "--duration-ms", str(DURATION_MS), "--start-delay-ms", "0", "--output", str(output),
                                 "--json"], capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        helper.stdin.write("\n")
        helper.stdin.close()
        helper.wait(30)
    doc = json.loads(result.stdout)
    fetched = sum(1 for h in doc["hosts"] for t in h["targets"] if t["local"])
    size_mb = sum((directory / f"r{r}" / f"rank{r}.json").stat().st_size for r in range(count)) / 1e6
    return {"agents": count, "exit": result.returncode, "fetched": fetched, "merged_events": doc["merged"]["events"],
            "fetched_mb": round(size_mb, 1), "wall_seconds": round(wall, 2), **doc["seconds"],
            "beyond_span_seconds": round(wall - DURATION_MS / 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", default="2,16,64")
    parser.add_argument("--events", type=int, default=20000, help="events per rank's trace")
    parser.add_argument("--serve", nargs=2, metavar=("COUNT", "DIR"))
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(int(args.serve[0]), pathlib.Path(args.serve[1])))
        return
    for count in (int(c) for c in args.agents.split(",")):
        print(json.dumps(measure(count, args.events)), flush=True)


if __name__ == "__main__":
    main()
