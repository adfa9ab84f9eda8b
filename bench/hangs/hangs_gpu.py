"""A real NCCL hang on 2 (or --ranks) GPUs, seen through agentd and `tuiprof stacks` / `tuiprof status`.

Run on the GPU machine from the repository root, after building the package
(bench/hangs/hangs_gpu.sh does both):
    python3 bench/hangs/hangs_gpu.py --out DIR

Starts agentd (real collectors, --hang-timeout-s 8, --hang-suspect-s 4) and
bench/hangs/hangs_gpu_job.py under `tuiprof run -- torchrun --nproc-per-node RANKS` (--ranks, 2);
rank 1 skips its all_reduce calls at step 30 and sleeps in
``skip_allreduce_and_sleep``, rank 0 launches the all_reduce and waits in the
next CUDA sync. From the agent's Watch stream it times the verdict levels from
the moment rank 1 skipped, then takes `tuiprof stacks --json` (Python frames,
then native), `tuiprof status --json`, and py-spy's cost per rank; the job is
killed (bounded waits throughout). Then a second job in which rank 1 raises
instead: how the agent reports both dead ranks (exit code / signal, exception).
Everything lands in DIR.

`cli` as the first argument runs the tuiprof subcommands this needs (run, stacks,
status) without the console's modules, which need textual (not on the GPU machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
from google.protobuf import json_format

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentd.hang import pyspy  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc  # noqa: E402
from agentd.address import AgentAddress  # noqa: E402
from tuiprof.client.channel import open_channel  # noqa: E402

JOB = ROOT / "bench" / "hangs" / "hangs_gpu_job.py"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HANG_TIMEOUT_S, SUSPECT_S, INTERVAL_MS = 8, 4, 500


def cli(argv: list[str]) -> int:
    """`tuiprof run|stacks|status ...` without the console's commands."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))  # tuiprof_headless, shared by the GPU benches
    from tuiprof_headless import main

    return main(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SEVERITY = {"ok": 0, "exited": 1, "suspect": 2, "hung": 3}


def family(job: subprocess.Popen) -> set[int]:
    """The pids of the job's processes (its ranks among them)."""
    try:
        return {p.pid for p in psutil.Process(job.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


async def watch_until_hung(address: AgentAddress, skipped: pathlib.Path, job: subprocess.Popen,
                           ranks: int, timeout: float) -> dict:
    """Follow Watch until the job's ranks are judged hung; when each level was first seen."""
    seen: dict = {"levels": {}}
    async with open_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 60)
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        async for snapshot in call:
            now_ns = time.time_ns()
            pids = family(job)
            live = [r for r in snapshot.ranks if r.pid in pids and r.state != pb.RANK_STATE_EXITED]
            verdicts = [v for v in snapshot.hang.ranks if v.pid in pids]
            if not skipped.exists() or len(live) < ranks or not verdicts:
                continue
            skip_ns = int(skipped.read_text())
            level = max((v.level for v in verdicts), key=SEVERITY.__getitem__)
            if level not in ("ok", "exited") and level not in seen["levels"]:
                text = " | ".join(v.explanation for v in verdicts)
                seen["levels"][level] = {"after_skip_s": round((now_ns - skip_ns) * 1e-9, 2), "verdicts": text}
                print(f"{level:8s} {(now_ns - skip_ns) * 1e-9:6.2f} s after the skip: {text}", flush=True)
            if level == "hung":
                call.cancel()
                seen["ranks"] = sorted(live, key=lambda r: r.rank)
                seen["verdicts"] = [v.explanation for v in verdicts]
                return seen
    raise RuntimeError("the agent never reported the job as hung")


def tuiprof(out: pathlib.Path, name: str, *argv: str) -> float:
    """Run one tuiprof subcommand (its stdout to out/name); seconds it took."""
    started = time.perf_counter()
    with open(out / name, "w") as stdout:
        done = subprocess.run([sys.executable, __file__, "cli", *argv], stdout=stdout, stderr=subprocess.PIPE,
                              text=True, timeout=180)
    took = time.perf_counter() - started
    print(f"tuiprof {' '.join(argv)} -> rc {done.returncode} in {took:.2f} s {done.stderr.strip()[-500:]}", flush=True)
    return took


def pyspy_costs(ranks: list[pb.RankStats], repeat: int) -> dict:
    binary = pyspy.find_pyspy()
    costs = {}
    for native in (False, True):
        for rank in ranks:
            times = []
            for _ in range(repeat):
                result = pyspy.dump(binary, rank.pid, rank.rank, native)
                if result.error:
                    raise RuntimeError(f"py-spy on rank {rank.rank}: {result.error}")
                times.append(result.dump_seconds * 1000)
            key = f"rank {rank.rank} {'native' if native else 'python'}"
            costs[key] = {"median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
                          "max_ms": round(max(times), 1)}
            print(f"py-spy dump {key}: {costs[key]}", flush=True)
    return costs


async def watch_crash(address: AgentAddress, job: subprocess.Popen, ranks: int, timeout: float) -> list[dict]:
    """The job's ranks once all are reported exited, with their verdicts."""
    pids: set[int] = set()
    async with open_channel(address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        async for snapshot in call:
            pids |= family(job)  # remembered: the ranks are gone when they are reported exited
            mine = [r for r in snapshot.ranks if r.pid in pids]
            verdicts = {v.pid: v.explanation for v in snapshot.hang.ranks}
            if len(mine) == ranks and all(r.state == pb.RANK_STATE_EXITED and r.pid in verdicts for r in mine):
                call.cancel()
                return [{"rank": r.rank, "exit_code": r.exit_code if r.HasField("exit_code") else None,
                         "exit_signal": r.exit_signal if r.HasField("exit_signal") else None,
                         "unavailable": dict(r.unavailable), "exception": r.exception,
                         "verdict": verdicts[r.pid]} for r in sorted(mine, key=lambda r: r.rank)]
    raise RuntimeError("the crashed job's ranks were never all reported exited")


def start_job(out: pathlib.Path, log: str, work: pathlib.Path, env: dict, ranks: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "cli", "run", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(ranks), str(JOB), "--skip-rank", "1", "--skip-at", "30", "--marker-dir", str(work), *extra],
        stdout=open(out / log, "wb"), stderr=subprocess.STDOUT, env=env)


def stop(job: subprocess.Popen, agent: subprocess.Popen | None) -> None:
    try:
        family = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for proc in family:
        proc.kill()
    psutil.wait_procs(family, timeout=30)
    for proc in family:
        for path in pathlib.Path("/dev/shm").glob(f"tuiprof-{os.getuid()}-{proc.pid}-*"):  # segment, side files
            path.unlink(missing_ok=True)
    if agent is not None:
        agent.terminate()
        agent.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2, help="one GPU each; rank 1 skips")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="hangs-gpu-"))
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    port = free_port()
    with open(out / "agentd.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port", str(free_port()),
             "--interval-ms", str(INTERVAL_MS), "--trace-dir", str(work / "traces"),
             "--hang-timeout-s", str(HANG_TIMEOUT_S), "--hang-suspect-s", str(SUSPECT_S)],
            stderr=log, env=env)
    job = start_job(out, "job.log", work, env, args.ranks)
    address = f"127.0.0.1:{port}"
    summary: dict = {"ranks": args.ranks, "hang_timeout_s": HANG_TIMEOUT_S, "suspect_s": SUSPECT_S, "interval_ms": INTERVAL_MS}
    try:
        seen = asyncio.run(watch_until_hung(AgentAddress("127.0.0.1", port), work / "skipped", job, args.ranks, timeout=240))
        summary["levels"] = seen["levels"]
        ranks = seen["ranks"]
        job_id = ranks[0].job_id
        summary["verdicts"] = seen["verdicts"]
        summary["inflight"] = {r.rank: [json_format.MessageToDict(op) for op in r.inflight] for r in ranks}
        summary["process_groups"] = {r.rank: [json_format.MessageToDict(g) for g in r.process_groups] or
                                     dict(r.unavailable).get("process_groups") for r in ranks}
        summary["stacks_s"] = tuiprof(out, "stacks.json", "stacks", address, "--json", "--job", job_id)
        summary["stacks_native_s"] = tuiprof(out, "stacks_native.json", "stacks", address, "--json", "--native",
                                             "--job", job_id)
        tuiprof(out, "status.json", "status", address, "--json")
        summary["pyspy"] = pyspy_costs(ranks, args.repeat)
        for name in ("stacks.json", "stacks_native.json"):
            doc = json.loads((out / name).read_text())
            summary[f"{name}: suspects"] = doc["suspects"]
            summary[f"{name}: classes"] = [(c["ranks"], c["leaf"]) for c in doc["classes"]]
            summary[f"{name}: dumps"] = [p for h in doc["hosts"] for p in h.get("processes", [])]
        stop(job, None)
        crash = start_job(out, "crash_job.log", work, env, args.ranks, "--crash")
        try:
            summary["crash"] = asyncio.run(watch_crash(AgentAddress("127.0.0.1", port), crash, args.ranks, 180))
        finally:
            stop(crash, None)
    finally:
        stop(job, agent)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli"]:
        sys.exit(cli(sys.argv[2:]))
    main()
