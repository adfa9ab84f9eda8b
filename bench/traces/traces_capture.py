"""`tuiprof trace` start to summary printed, beyond the traced span: agents' summaries against fetching everything.

    .venv/bin/python bench/traces/traces_capture.py [--agents 64] [--ranks 8] [--events 20000]

The agents are simulated in one helper process (one gRPC server per agent on its
own loopback port), each with ``--ranks`` ranks whose Kineto-shaped files
(``traces_merge.generate``, ``--events`` events each) are finished when the
traced span ends. FetchFile is agentd's real implementation
(``CaptureService.fetch_file``). Two paths, in one run, with the unchanged CLI:

- ``summaries`` (the default path since issue 15): each agent's last status
  reply carries its ranks' summaries, made beforehand by agentd's real
  summariser (``agentd.traces.analysis.summarise.summarise_file``) on the same
  files; every agent reports them only after the node-side time, measured in
  the same run as agentd spends it (one agent's ranks' files summarised one
  after another on one thread), so the CLI's wall time includes the node-side
  work as if every node ran in parallel. The CLI: `tuiprof trace
  HOST… --duration-ms 1000 --start-delay-ms 0 --json`.
- ``fetch-all`` (the path before issue 15): agents send no summary; the CLI
  fetches every file and merges them: `tuiprof trace HOST… --merge …`.

Figures: CLI wall time minus the 1 s span, and the CLI's peak RSS (``wait4``'s
``ru_maxrss``: the CLI process or, when larger, its largest child, e.g. a merge
worker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agentd.auth import Caller, set_current_caller  # noqa: E402
from agentd.kineto.registry import Registry  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc  # noqa: E402
from agentd.traces.analysis.summarise import summarise_file  # noqa: E402
from agentd.traces.paths import TraceDir  # noqa: E402
from agentd.traces.service import CaptureService  # noqa: E402

WORK = pathlib.Path(__file__).resolve().parents[1] / ".work" / "capture"  # bench/.work, ignored by git
DURATION_MS = 1000
PATHS = ("summaries", "fetch-all")


class SimulatedAgent(pb_grpc.AgentServicer):
    """``ranks`` ranks whose traces are written when the span ends; summaries (if any) after the agent's own
    summarising time; files served by agentd's FetchFile."""

    def __init__(self, index: int, ranks: int, trace_dir: pathlib.Path, summarising_seconds: float | None) -> None:
        self.host = f"sim{index}"
        self.ranks = [index * ranks + local for local in range(ranks)]
        self.files = CaptureService(trace_dir, self.host, Registry())
        with_summaries = summarising_seconds is not None
        self.summaries = [_load_summary(trace_dir, rank) for rank in self.ranks] if with_summaries else []
        self.summarising_seconds = summarising_seconds or 0.0
        self.written_at = float("inf")

    async def CaptureTrace(self, request, context):
        self.written_at = request.start_time_unix_ms / 1000 + request.duration_ms / 1000
        return self._reply()

    async def GetCaptureStatus(self, request, context):
        return self._reply()

    async def FetchFile(self, request, context):
        set_current_caller(Caller.token_holder())  # as agentd's servicer does for a call with the token
        async for chunk in self.files.fetch_file(request, context):
            yield chunk

    def _reply(self) -> pb.CaptureTraceReply:
        now = time.time()
        written = now >= self.written_at
        done = written and now >= self.written_at + self.summarising_seconds
        reply = pb.CaptureTraceReply(capture_id="sim", done=done)
        for position, rank in enumerate(self.ranks):
            target = reply.targets.add(host=self.host, pid=1000 + rank, rank=rank,
                                       state="written" if written else "sent", file=_name(rank))
            if done and self.summaries:
                target.summary.CopyFrom(self.summaries[position])
        return reply


def _name(rank: int) -> str:
    return f"rank{rank}.json"


def _load_summary(trace_dir: pathlib.Path, rank: int) -> pb.RankTraceSummary:
    return pb.RankTraceSummary.FromString((trace_dir / f"{_name(rank)}.summary.pb").read_bytes())


async def serve(agents: int, ranks: int, directory: pathlib.Path, summarising_seconds: float | None) -> None:
    servers, ports = [], []
    for index in range(agents):
        server = grpc.aio.server()
        agent = SimulatedAgent(index, ranks, directory / f"a{index}", summarising_seconds)
        pb_grpc.add_AgentServicer_to_server(agent, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for server in servers:
        await server.stop(0)


def _prepare_rank(job: tuple[pathlib.Path, int, int]) -> None:
    """One rank's file and agentd's summary of it, made once and kept under bench/.work."""
    from traces_merge import generate

    folder, rank, events = job
    path = folder / _name(rank)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        generate(path, rank, events, seed=rank)
    summary_path = folder / f"{_name(rank)}.summary.pb"
    if not summary_path.exists():
        summary = summarise_file(TraceDir(folder), _name(rank), f"sim{rank}", 1000 + rank, rank)
        assert not summary.error, summary.error
        summary_path.write_bytes(summary.SerializeToString())


def prepare(agents: int, ranks: int, events: int) -> pathlib.Path:
    directory = WORK / f"{agents}x{ranks}x{events}"
    jobs = [(directory / f"a{index}", index * ranks + local, events) for index in range(agents) for local in range(ranks)]
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_prepare_rank, jobs))
    return directory


def node_seconds(directory: pathlib.Path, ranks: int) -> float:
    """What one agent spends summarising its ranks' files (agent 0's), one after another as agentd does."""
    started = time.perf_counter()
    for rank in range(ranks):
        summary = summarise_file(TraceDir(directory / "a0"), _name(rank), "sim0", 1000 + rank, rank)
        assert not summary.error, summary.error
    return time.perf_counter() - started


def measure(agents: int, ranks: int, events: int, path: str) -> dict:
    directory = prepare(agents, ranks, events)
    on_node = node_seconds(directory, ranks) if path == "summaries" else None
    helper = subprocess.Popen([sys.executable, __file__, "--serve", str(agents), str(ranks), str(directory),
                               "" if on_node is None else f"{on_node:.3f}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    output = WORK / f"out-{agents}x{ranks}-{path}"
    extra = ["--merge"] if path == "fetch-all" else []
    try:
        ports = json.loads(helper.stdout.readline())
        started = time.perf_counter()
        cli = subprocess.Popen([sys.executable, "-m", "tuiprof.cli", "trace", *[f"127.0.0.1:{p}" for p in ports],
                                "--duration-ms", str(DURATION_MS), "--start-delay-ms", "0", "--output", str(output),
                                "--json", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        stdout = cli.stdout.read()
        _, status, usage = os.wait4(cli.pid, 0)
        wall = time.perf_counter() - started
    finally:
        helper.stdin.write("\n")
        helper.stdin.close()
        helper.wait(60)
    doc = json.loads(stdout)
    files = [directory / f"a{i}" / _name(i * ranks + r) for i in range(agents) for r in range(ranks)]
    return {"path": path, "agents": agents, "ranks": agents * ranks, "exit": os.waitstatus_to_exitcode(status),
            "summary_ranks": len((doc["summary"] or {}).get("ranks", [])), "summary_from": doc["summary_from"],
            "fetched_files": sum(1 for h in doc["hosts"] for t in h["targets"] if t["local"]),
            "trace_mb": round(sum(f.stat().st_size for f in files) / 1e6, 1),
            "node_summarise_seconds": None if on_node is None else round(on_node, 2),
            "wall_seconds": round(wall, 2), "beyond_span_seconds": round(wall - DURATION_MS / 1000, 2),
            "cli_peak_rss_mb": round(usage.ru_maxrss / 1024, 1), **doc["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per agent")
    parser.add_argument("--events", type=int, default=20000, help="events per rank's trace")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--serve", nargs=4, metavar=("AGENTS", "RANKS", "DIR", "NODE_SECONDS"))
    args = parser.parse_args()
    if args.serve:
        agents, ranks, directory, on_node = args.serve
        asyncio.run(serve(int(agents), int(ranks), pathlib.Path(directory), float(on_node) if on_node else None))
        return
    for path in args.paths.split(","):
        print(json.dumps(measure(args.agents, args.ranks, args.events, path)), flush=True)


if __name__ == "__main__":
    main()
