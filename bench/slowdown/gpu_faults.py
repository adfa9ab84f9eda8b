"""The slowdown verdict on a real 4-GPU DDP job: each fault injected on one rank, named how fast, right?

Run on the GPU machine from the repository root, after building the package in place
(bench/slowdown/gpu_faults.sh does both):
    python3 bench/slowdown/gpu_faults.py --out DIR [--healthy-s 150] [--faults gemm,cpu,dataloader,gc,clocks]

Starts agentd (real collectors, 500 ms interval) and bench/slowdown/gpu_job.py under
`tuiprof run -- torchrun --nproc-per-node 4`, and follows the agent's Watch stream throughout.
After a healthy warm-up, one fault at a time on one rank:
  (a) gemm      a competing GEMM loop on that rank's GPU (another process);
  (b) cpu       busy processes pinned to that rank's cores, each in a session of its own;
  (c) dataloader  that rank's batches 40 ms slower;
  (d) gc        that rank collecting 40 ms of cyclic garbage a step;
  (e) clocks    that GPU's SM clock locked low with `nvidia-smi -lgc` (or its power capped with
                `-pl`); when the machine refuses both, (a) at a second, lighter intensity.
For each: seconds from the injection to the first verdict naming the right rank with the right
cause, the verdict's cost against the slowdown the job's own step timer measured (median step of
rank 0 after against before), and the cause. Then a healthy stretch: every snapshot's verdict
counted, a slow one a false alarm. Everything lands in DIR (summary.json).

`cli` as the first argument runs `tuiprof run` without the console's modules (no Textual here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentd.address import AgentAddress  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc  # noqa: E402
from agentd.proto.words import slowdown_cause  # noqa: E402
from tuiprof.client.channel import open_channel  # noqa: E402

JOB = pathlib.Path(__file__).with_name("gpu_job.py")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
INTERVAL_MS = 500
NAMED_WITHIN_S = 30.0   # give up on a fault after this long (the issue asks for 10 s: recorded, not assumed)
SETTLE_S = 15.0         # with the fault on, before its cost is read
CLEAR_S = 20.0          # with it off again, before the next
EXPECTED = {"gemm": "gpu_contention", "gemm_light": "gpu_contention", "cpu": "cpu_starved",
            "dataloader": "input_pipeline", "gc": "gc_pauses", "clocks": "gpu_slower"}
GEMM_LOOP = """
import sys, torch
n = int(sys.argv[1]); a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
while True:
    a @ a
    torch.cuda.synchronize()
"""


def cli(argv: list[str]) -> int:
    """`tuiprof run ...` with the command's own parser (every option keeps its default)."""
    from tuiprof.commands import run

    parser = argparse.ArgumentParser(prog="tuiprof")
    run.add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Verdicts:
    """Every snapshot's verdict of the job, as (Unix time, JobSlowdown or None), kept by a background watch."""

    def __init__(self, record: pathlib.Path | None) -> None:
        self.seen: list[tuple[float, pb.JobSlowdown | None]] = []
        self.pids: dict[int, int] = {}  # rank → pid
        self.job_id = ""
        self.record = record

    async def follow(self, address: AgentAddress, job_pids) -> None:
        async with open_channel(address) as channel:
            await asyncio.wait_for(channel.channel_ready(), 60)
            async for snapshot in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest()):
                if self.record is not None:  # gzip'd, each snapshot's bytes after their length (4 bytes, little-endian)
                    with gzip.open(self.record, "ab") as record:
                        data = snapshot.SerializeToString()
                        record.write(len(data).to_bytes(4, "little") + data)
                mine = [r for r in snapshot.ranks if r.pid in job_pids() and r.state != "exited"]
                if mine:
                    self.job_id = mine[0].job_id
                    self.pids = {r.rank: r.pid for r in mine if r.HasField("rank")}
                verdict = next((v for v in snapshot.slowdowns if v.job_id == self.job_id and self.job_id), None)
                self.seen.append((time.time(), verdict))

    def latest(self) -> pb.JobSlowdown | None:
        return self.seen[-1][1] if self.seen else None


def step_seconds(step_log: str, since: float, until: float) -> float:
    """Rank 0's median step time between two Unix times, by the job's own step timer."""
    lines = pathlib.Path(f"{step_log}-0").read_text().splitlines()
    steps = [float(s) for t, s in (line.split() for line in lines if line.count(" ") == 1) if since <= float(t) <= until]
    return statistics.median(steps)


class Fault:
    """One injection on one rank, on and off."""

    def __init__(self, kind: str, rank: int, control: pathlib.Path, verdicts: Verdicts, env: dict) -> None:
        self.kind, self.rank, self.control, self.verdicts, self.env = kind, rank, control, verdicts, env
        self.processes: list[subprocess.Popen] = []
        self.undo: list[list[str]] = []
        self.note = ""

    def on(self) -> None:
        if self.kind in ("gemm", "gemm_light"):
            size = "8192" if self.kind == "gemm" else "2048"
            self.processes.append(subprocess.Popen(
                [sys.executable, "-c", GEMM_LOOP, size], start_new_session=True,
                env={**self.env, "CUDA_VISIBLE_DEVICES": str(self.rank)}))
        elif self.kind == "cpu":
            cores = sorted(os.sched_getaffinity(self.verdicts.pids[self.rank]))
            self.processes += [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                                                preexec_fn=lambda: os.sched_setaffinity(0, cores))
                               for _ in range(2 * len(cores))]
        elif self.kind in ("dataloader", "gc"):
            write_control(self.control, {"rank": self.rank, "fault": self.kind, "ms": 40})
        elif self.kind == "clocks":
            self.note = self._lower_clocks()
        print(f"fault {self.kind} on rank {self.rank} {self.note}", flush=True)

    def _lower_clocks(self) -> str:
        """Lock the GPU's SM clock low, else cap its power; what was done (or refused)."""
        gpu = str(self.rank)
        tries = [(["nvidia-smi", "-i", gpu, "-lgc", "600,600"], ["nvidia-smi", "-i", gpu, "-rgc"]),
                 (["nvidia-smi", "-i", gpu, "-pl", _min_power(gpu)], ["nvidia-smi", "-i", gpu, "-pl", _default_power(gpu)])]
        refusals = []
        for do, undo in tries:
            try:
                done = subprocess.run(do, capture_output=True, text=True, timeout=30)
            except OSError as exc:
                refusals.append(f"{' '.join(do)}: {exc}")
                continue
            if done.returncode == 0:
                self.undo.append(undo)
                return f"{' '.join(do)}: {done.stdout.strip()}"
            refusals.append(f"{' '.join(do)} -> {done.returncode}: {(done.stdout + done.stderr).strip()}")
        self.kind = "refused"
        return "refused: " + " | ".join(refusals)

    def off(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.returncode not in (0, -signal.SIGKILL):
                self.note += f" (pid {proc.pid} of the fault ended by itself with {proc.returncode})"
        for undo in self.undo:
            subprocess.run(undo, capture_output=True, timeout=30)
        write_control(self.control, {})


def _min_power(gpu: str) -> str:
    return _query(gpu, "power.min_limit")


def _default_power(gpu: str) -> str:
    return _query(gpu, "power.default_limit")


def _query(gpu: str, field: str) -> str:
    try:
        done = subprocess.run(["nvidia-smi", "-i", gpu, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return "0"
    return done.stdout.strip().split(".")[0] or "0"


def write_control(path: pathlib.Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


async def run_fault(fault: Fault, verdicts: Verdicts, step_log: str) -> dict:
    before = time.time()
    fault.on()
    if fault.kind == "refused":
        return {"fault": "clocks", "rank": fault.rank, "refused": fault.note}
    injected = time.time()
    result: dict = {"fault": fault.kind, "rank": fault.rank, "note": fault.note, "expected_cause": EXPECTED[fault.kind]}
    named_at = None
    while time.time() - injected < NAMED_WITHIN_S and named_at is None:
        await asyncio.sleep(0.1)
        for at, verdict in verdicts.seen:
            if at >= injected and verdict is not None and verdict.slow and verdict.culprits:
                if result.get("first_named") is None:
                    result["first_named"] = {"after_s": round(at - injected, 2), "rank": verdict.culprits[0].rank,
                                             "cause": slowdown_cause(verdict.cause)}
                if verdict.culprits[0].rank == fault.rank and slowdown_cause(verdict.cause) == EXPECTED[fault.kind]:
                    named_at = at
                    break
    result["named_after_s"] = None if named_at is None else round(named_at - injected, 2)
    await asyncio.sleep(max(0.0, SETTLE_S - (time.time() - injected)))
    verdict = verdicts.latest()
    truth = step_seconds(step_log, time.time() - 8, time.time()) - step_seconds(step_log, before - 15, before)
    result["truth_slowdown_ms"] = round(truth * 1e3, 2)
    if verdict is not None:
        result["verdict"] = {"slow": verdict.slow, "cause": slowdown_cause(verdict.cause),
                             "culprits": [(c.rank, round(c.cost_seconds * 1e3, 2), round(c.cost_percent, 1))
                                          for c in verdict.culprits],
                             "cost_ms": round(verdict.cost_seconds * 1e3, 2), "evidence": list(verdict.evidence),
                             "unchecked": list(verdict.unchecked),
                             "step_ms": round(verdict.step_seconds * 1e3, 2) if verdict.HasField("step_seconds") else None}
        if verdict.culprits and truth > 0:
            result["cost_vs_truth"] = round(verdict.culprits[0].cost_seconds / truth, 3)
    fault.off()
    await asyncio.sleep(CLEAR_S)
    latest = verdicts.latest()
    result["cleared"] = latest is None or not latest.slow
    print(json.dumps(result), flush=True)
    return result


async def bench(args, address: AgentAddress, job: subprocess.Popen, control: pathlib.Path, step_log: str,
                env: dict) -> dict:
    verdicts = Verdicts(args.record)

    def job_pids() -> set[int]:
        try:
            return {p.pid for p in psutil.Process(job.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    follower = asyncio.create_task(verdicts.follow(address, job_pids))
    summary: dict = {"interval_ms": INTERVAL_MS}
    deadline = time.time() + 240
    while len(verdicts.pids) < args.ranks or verdicts.latest() is None \
            or not verdicts.latest().HasField("baseline_step_seconds"):
        assert job.poll() is None, "the job ended"
        assert time.time() < deadline, "the job's ranks never got a verdict"
        await asyncio.sleep(1)
    await asyncio.sleep(args.warmup_s)
    start = time.time()
    chosen = [kind for kind in args.faults.split(",") if kind]
    faults = [Fault(kind, rank % args.ranks, control, verdicts, env) for kind, rank in
              (("gemm", 1), ("cpu", 2), ("dataloader", 3), ("gc", 1), ("clocks", 2)) if kind in chosen]
    results = []
    for fault in faults:
        result = await run_fault(fault, verdicts, step_log)
        if "refused" in result:
            results.append(result)
            result = await run_fault(Fault("gemm_light", fault.rank, control, verdicts, env), verdicts, step_log)
        results.append(result)
    summary["faults"] = results
    healthy_from = time.time()
    await asyncio.sleep(args.healthy_s)
    healthy = [v for at, v in verdicts.seen if at >= healthy_from and v is not None]
    summary["healthy"] = {"seconds": round(time.time() - healthy_from, 1), "snapshots": len(healthy),
                          "false_verdicts": [(round(at - healthy_from, 1), slowdown_cause(v.cause), [c.rank for c in v.culprits])
                                             for at, v in verdicts.seen if at >= healthy_from and v is not None and v.slow],
                          "max_rank_cost_percent": round(max((c.cost_percent for v in healthy for c in v.ranks),
                                                             default=0.0), 2),
                          "step_ms": round(step_seconds(step_log, healthy_from, time.time()) * 1e3, 2)}
    warm = [v for at, v in verdicts.seen if start - args.warmup_s <= at < start and v is not None]
    summary["warmup"] = {"snapshots": len(warm), "false_verdicts": sum(v.slow for v in warm),
                         "step_ms": round(step_seconds(step_log, start - args.warmup_s, start) * 1e3, 2),
                         "max_rank_cost_percent": round(max((c.cost_percent for v in warm for c in v.ranks),
                                                            default=0.0), 2)}
    follower.cancel()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--warmup-s", type=float, default=30)
    parser.add_argument("--healthy-s", type=float, default=150)
    parser.add_argument("--faults", default="gemm,cpu,dataloader,gc,clocks",
                        help="which faults, in this order ('' for a healthy run only)")
    parser.add_argument("--record", type=pathlib.Path,
                        help="also write every snapshot of the run here (gzip'd, each after its length in 4 bytes)")
    parser.add_argument("job_args", nargs="*", help="passed to gpu_job.py (e.g. --cpu --width 256)")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="slowdown-gpu-"))
    control, step_log = work / "control.json", str(work / "steps")
    write_control(control, {})
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    port = free_port()
    with open(out / "agentd.log", "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port",
                                  str(free_port()), "--interval-ms", str(INTERVAL_MS), "--trace-dir", str(work / "traces")],
                                 stderr=log, env=env)
    with open(out / "job.log", "wb") as log:
        job = subprocess.Popen(
            [sys.executable, __file__, "cli", "run", "--no-kineto-daemon", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", str(args.ranks), str(JOB), "--control", str(control), "--step-log", step_log,
             *args.job_args], stdout=log, stderr=subprocess.STDOUT, env=env)
    summary: dict = {}
    try:
        summary = asyncio.run(bench(args, AgentAddress("127.0.0.1", port), job, control, step_log, env))
    finally:
        for proc in [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        agent.terminate()
        agent.wait(timeout=30)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli"]:
        sys.exit(cli(sys.argv[2:]))
    main()
