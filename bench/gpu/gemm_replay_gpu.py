"""`tuiprof gemm-replay` on a GPU: a job's GEMMs in the job (as the agent saw them, as the program timed
them with its own CUDA events) against the same shapes replayed alone.

Two runs of one small PyTorch job under `tuiprof run` on cuda:0, each ``--seconds`` (20) long, agentd
started here (as rank_figures_gpu's phases start it) and `tuiprof record` writing its snapshots:

- ``quiet``: the job alone on the GPU. Its GEMMs run as fast as the GPU runs them, so the replay must
  read "as fast alone as in the job -> not contention" (alone within FASTER_ALONE of the job's, the median over its shapes), and the
  agent's in-job figures agree with the program's events.
- ``contended``: a second process runs large bf16 GEMMs on the same GPU the whole time. The job's GEMMs
  share the GPU, so the replay must read "fast alone -> contention or the job's surroundings".

After each run `tuiprof gemm-replay --recording` replays the job's shapes on cuda:0 (the job stopped: the
GPU is idle), with its default warm-up and again after LONG_WARMUP_SECONDS of warm-up a shape (sustained clocks). The
program keeps the mean of its calls (FLOPs over kernel time, as the agent counts) and their median (as
the replay counts): under contention they part, as a few calls wait out the other process. With a second GPU, the quiet run is also replayed live, against the agent while the job
runs, on cuda:1. The job: bf16 mm 4096^3, bf16 mm m=2048 n=8192 k=4096, bf16 bmm 8 x 1024^3, fp32 mm
2048^3 (TF32 off, as the replay), round-robin in blocks of 50 calls, every call between two CUDA events.

    python3 bench/gpu/gemm_replay_gpu.py --out DIR        # on the GPU machine, from the checkout

Writes DIR/gemm_replay_gpu.json (per run and shape: TFLOPS in the job from the agent, from the program's
events, alone, the reading; the checks) and DIR/<run>_* (recordings, the replay's report, logs). Builds
the hook library first when it is not built. Report: bench/gpu/gemm_replay_gpu.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent), str(pathlib.Path(__file__).resolve().parents[2])]
from rank_figures_gpu import AGENTD, ROOT, TUIPROF_RUN, env, free_ports, read_line  # noqa: E402

from tuiprof.analysis.gemm_replay import FASTER_ALONE  # noqa: E402

JOB_ID = "gemm-replay-bench"
BLOCK_CALLS = 50  # calls of one shape in a row, each between its own two events
# cuBLAS's (b, m, n, k) and dtype of each of the job's GEMMs (what the hook records and the replay runs)
SHAPES = [("bf16", 1, 4096, 4096, 4096), ("bf16", 1, 2048, 8192, 4096), ("bf16", 8, 1024, 1024, 1024),
          ("fp32", 1, 2048, 2048, 2048)]
LONG_WARMUP_SECONDS = 2.0  # sustained clocks: ten times the default warm-up
HOG = """
import sys, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
print("READY", flush=True)
while True:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def shape_text(b: int, m: int, n: int, k: int) -> str:
    return f"b={b} m={m} n={n} k={k}"


# ---------------------------------------------------------------- the job (inside `tuiprof run`)

def worker(out: pathlib.Path, seconds: float) -> None:
    """The job: every call of every shape timed with its own events; the median per shape to job.json."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    calls = []
    for dtype, b, m, n, k in SHAPES:
        batch = (b,) if b > 1 else ()
        # torch.mm(X[n,k], Y[k,m]) is cuBLAS's C[m,n] = A[m,k]·B[k,n] with A = Y: the hook records (m, n, k)
        x = torch.randn(*batch, n, k, device="cuda:0", dtype=dtypes[dtype])
        y = torch.randn(*batch, k, m, device="cuda:0", dtype=dtypes[dtype])
        calls.append((lambda x=x, y=y: torch.bmm(x, y)) if batch else (lambda x=x, y=y: torch.mm(x, y)))
    seconds_of: list[list[float]] = [[] for _ in SHAPES]
    for gemm in calls:  # first calls (loading, algorithm choice) apart, as the hook keeps them apart
        gemm()
    torch.cuda.synchronize()
    print("READY", flush=True)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for index, gemm in enumerate(calls):
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(BLOCK_CALLS)]
            for start, end in pairs:
                start.record()
                gemm()
                end.record()
            torch.cuda.synchronize()
            seconds_of[index] += [start.elapsed_time(end) / 1e3 for start, end in pairs]
    result = {}
    for (dtype, b, m, n, k), times in zip(SHAPES, seconds_of, strict=True):
        flops, median = 2 * b * m * n * k, statistics.median(times)
        # the mean is what the agent reports (FLOPs over kernel time); the median is what the replay reports
        result[f"{dtype} {shape_text(b, m, n, k)}"] = {
            "calls": len(times), "median_seconds": median, "tflops_median": flops / median / 1e12,
            "tflops": flops * len(times) / sum(times) / 1e12}
    (out / "job.json").write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------- the runs

def gemm_replay(*argv: str, log: pathlib.Path) -> str:
    """`tuiprof gemm-replay ARGV` (stderr to ``log``); its report."""
    command = [sys.executable, "-m", "tuiprof.cli", "gemm-replay", *argv]
    with log.open("w") as err:
        done = subprocess.run(command, env=env(), stdout=subprocess.PIPE, stderr=err, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"gemm-replay exited {done.returncode}: {log.read_text().strip()}")
    return done.stdout


SIGNATURE = re.compile(r"^(\S+) (\S+) (b=\d+ m=\d+ n=\d+ k=\d+)  \(\d+ calls in the job\)$")
FIGURE = re.compile(r"^\s+(in the job|alone|reading):\s+(.*)$")
FIELDS = {"in the job": "in_job", "alone": "alone", "reading": "reading"}


def parse_report(report: str) -> dict[str, dict]:
    """The replay's report, per "dtype shape": its interposers, TFLOPS in the job and alone (None where the
    report says n/a or not replayed, with the text), and the reading."""
    rows: dict[str, dict] = {}
    current: dict = {}
    for line in report.splitlines():
        if match := SIGNATURE.match(line):
            current = rows.setdefault(f"{match[2]} {match[3]}", {"ops": []})
            current["ops"].append(match[1])
        elif current and (match := FIGURE.match(line)):
            field, text = FIELDS[match[1]], match[2]
            number = re.match(r"([0-9.eE+-]+) TFLOP/s", text)
            current[field] = text if field == "reading" else float(number[1]) if number else None
            if field != "reading" and number is None:
                current[f"{field}_why"] = text
    return rows


def stop(process: subprocess.Popen | None, how: signal.Signals) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(how)
        process.wait(timeout=30)


def one_run(name: str, out: pathlib.Path, seconds: float, contended: bool, live_device: str | None) -> dict:
    """One job under `tuiprof run` with agentd and `tuiprof record` watching it, then its replays."""
    port, metrics = free_ports(2)
    with contextlib.ExitStack() as logs:
        def log(what: str):
            return logs.enter_context((out / f"{name}_{what}.log").open("w"))

        agent = subprocess.Popen([*AGENTD, "--port", str(port), "--metrics-port", str(metrics), "--interval-ms",
                                  "500", "--trace-dir", str(out / f"{name}_traces")], env=env(), stdout=log("agentd"),
                                 stderr=subprocess.STDOUT)
        recording = out / f"{name}_job.ndjson"
        recording.unlink(missing_ok=True)
        hog = recorder = job = None
        result: dict = {"contended": contended}
        try:
            time.sleep(3)
            if contended:
                hog = subprocess.Popen([sys.executable, "-c", HOG], env=env(), stdout=subprocess.PIPE, text=True,
                                       stderr=log("hog"))
                read_line(hog, "READY")
            recorder = subprocess.Popen([sys.executable, "-m", "tuiprof.cli", "record", str(recording),
                                         f"127.0.0.1:{port}"], env=env(), stderr=log("record"))
            job_env = {**env(), "RANK": "0", "WORLD_SIZE": "1", "TUIPROF_JOB_ID": JOB_ID}
            job = subprocess.Popen([*TUIPROF_RUN, "--agent-port", str(port), "--", sys.executable, __file__, "worker",
                                    "--out", str(out), "--seconds", str(seconds)], env=job_env,
                                   stdout=subprocess.PIPE, stderr=log("job"), text=True)
            read_line(job, "READY")
            if live_device is not None:
                time.sleep(min(5.0, seconds / 4))  # some intervals of the job first
                report = gemm_replay(f"127.0.0.1:{port}", "--pid", str(job.pid), "--device", live_device,
                                     "--seconds", "5", log=out / f"{name}_live_replay.log")
                (out / f"{name}_live_replay.txt").write_text(report)
                result["live"] = {"device": live_device, "rows": parse_report(report)}
            if job.wait(timeout=seconds + 300) != 0:
                raise SystemExit(f"the job exited {job.returncode}: see {out / f'{name}_job.log'}")
            time.sleep(1.5)  # the agent's last intervals of the job
        finally:
            stop(job, signal.SIGTERM)  # still running only when something above failed
            stop(recorder, signal.SIGINT)  # record's Ctrl-C: the file ends with what it wrote
            stop(hog, signal.SIGTERM)
            stop(agent, signal.SIGTERM)
    result["program"] = json.loads((out / "job.json").read_text())
    (out / "job.json").rename(out / f"{name}_job.json")
    report = gemm_replay("--recording", str(recording), "--pid", str(job.pid), "--device", "cuda:0",
                         log=out / f"{name}_replay.log")
    (out / f"{name}_replay.txt").write_text(report)
    result["after"] = {"device": "cuda:0", "rows": parse_report(report)}
    # the same after a long warm-up (~0.1-1 s a shape): does a GPU at its sustained clocks change the reading?
    report = gemm_replay("--recording", str(recording), "--pid", str(job.pid), "--device", "cuda:0",
                         "--warmup-seconds", str(LONG_WARMUP_SECONDS), log=out / f"{name}_replay_long_warmup.log")
    (out / f"{name}_replay_long_warmup.txt").write_text(report)
    result["after_long_warmup"] = {"device": "cuda:0", "warmup_seconds": LONG_WARMUP_SECONDS, "rows": parse_report(report)}
    return result


def ratios(run: dict, replay: str) -> dict[str, float | None]:
    """Per shape of the job: alone over in the job, as the replay found them (None: not found or n/a)."""
    found = {key: run[replay]["rows"].get(key, {}) for key in run["program"]}
    return {key: row["alone"] / row["in_job"] if row.get("alone") and row.get("in_job") else None
            for key, row in found.items()}


def checks(runs: dict[str, dict]) -> dict[str, bool]:
    """What the runs must show: every shape of the job found with both figures; the agent's in-job figure
    within 10 % of the program's own (the mean: FLOPs over kernel time, as the agent counts) in the quiet
    run; the quiet run read as the GPU and the contended one as contention, over the job's shapes (their
    median ratio: contention slows some shapes' calls more than others')."""
    quiet, contended = ratios(runs["quiet"], "after"), ratios(runs["contended"], "after")
    agree = [abs(runs["quiet"]["after"]["rows"][key]["in_job"] / own["tflops"] - 1) < 0.10
             for key, own in runs["quiet"]["program"].items() if quiet[key] is not None]
    found = all(r is not None for r in [*quiet.values(), *contended.values()])
    return {"every_shape_found": found,
            "quiet_in_job_within_10_percent_of_the_programs_events": found and all(agree),
            "quiet_reads_the_gpu": found and statistics.median(quiet.values()) < FASTER_ALONE,
            "contended_reads_contention": found and statistics.median(contended.values()) >= FASTER_ALONE}


def table(runs: dict[str, dict]) -> list[str]:
    """TFLOPS per run and shape: the agent's in the job, the program's (mean, median), alone after the job
    (warm-up 0.2 s, LONG_WARMUP_SECONDS), alone live on a second GPU; the replay's reading."""
    def figure(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    lines = [f"{'run':10} {'dtype shape':30} {'agent':>7} {'mean':>7} {'median':>7} {'alone':>7} {'warm':>7} "
             f"{'live':>7}  reading"]
    for name, run in runs.items():
        for key, own in run["program"].items():
            row = run["after"]["rows"].get(key, {})
            warm = run.get("after_long_warmup", {}).get("rows", {}).get(key, {})
            live = run.get("live", {}).get("rows", {}).get(key, {})
            lines.append(f"{name:10} {key:30} {figure(row.get('in_job')):>7} {figure(own['tflops']):>7} "
                         f"{figure(own['tflops_median']):>7} {figure(row.get('alone')):>7} "
                         f"{figure(warm.get('alone')):>7} {figure(live.get('alone')):>7}  {row.get('reading', 'not seen')}")
    return lines


def ensure_hook() -> None:
    if not (ROOT / "tuiprof_native" / "libtuiprof_hook.so").is_file():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", nargs="?", choices=["all", "worker"], default="all", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where results and logs go")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each run of the job lasts (default 20)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "worker":
        worker(args.out, args.seconds)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: this bench runs on a GPU machine")
    ensure_hook()
    live = "cuda:1" if torch.cuda.device_count() > 1 else None
    runs = {"quiet": one_run("quiet", args.out, args.seconds, contended=False, live_device=live),
            "contended": one_run("contended", args.out, args.seconds, contended=True, live_device=None)}
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "seconds": args.seconds,
              "live_replay": live or "skipped: one GPU", "runs": runs, "checks": checks(runs)}
    (args.out / "gemm_replay_gpu.json").write_text(json.dumps(result, indent=1))
    print("\n".join(table(runs)))
    print(json.dumps(result["checks"], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
