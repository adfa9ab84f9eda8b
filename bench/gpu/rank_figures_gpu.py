"""One GPU: every rank figure of issue 13 against measurements our code did not make.

Phases (each writes DIR/<phase>.json; bench/gpu/rank_figures_gpu.sh runs them in two device calls):

- ``accuracy``  mm / linear+bias / bmm bf16 and fp32 mm (kernels of 0.6 ms and more: the default
  adaptive sampling keeps 1 in 16), and a smaller mm 3072^3 bf16 (~0.1 ms: a longer period), under
  `tuiprof run` with the default sampling: counts exact, TFLOPS from the timed calls against the
  program's own CUDA events.
- ``timeline``  back-to-back bf16 GEMMs with `--gemm-sample-every 1`: the hook's ring events
  (placed on the GPU clock) against the program's own events placed with its own anchor.
- ``eventcost`` GPU time a timed call adds, measured directly: a loop of small GEMMs between two
  outer events, all calls timed vs none timed (after the first 32).
- ``long-start`` / ``long-collect``  a 10-minute job watched by three agentd at --interval-ms
  250 / 500 / 1000 (started with setsid, outliving the device call); each agent's published
  intervals must add up to the job's GEMM count with none lost or repeated.
- ``overhead``  10 interleaved pairs (plain / under `tuiprof run`, agentd running; ``--pairs``),
  each 300 steps of a ~30 ms and a ~5 ms bf16 training step (``--sizes`` keeps one of them):
  paired differences, bootstrap 95 % CI.
- ``overhead-alternating``  the same comparison without a process start per run: one plain and one
  hooked process stay up, chunks of 300 steps alternate between them in ABBA order (``--pairs``,
  ``--seconds``: stop before a pair would pass it; ``--sizes``: the first size).
- ``overhead-combine``  the pairs of several ``overhead`` runs (``--inputs``, the same code on the
  same machine) as one set: the same statistics over all of them.

    python3 bench/gpu/rank_figures_gpu.py PHASE --out DIR      # on the GPU machine, from the checkout
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from itertools import pairwise

ROOT = pathlib.Path(__file__).resolve().parents[2]
TUIPROF_RUN = [sys.executable, str(ROOT / "bench" / "gpu" / "tuiprof_headless.py"), "run"]
AGENTD_CODE = "import sys; from agentd.cli import main; sys.exit(main())"
AGENTD = [sys.executable, "-c", AGENTD_CODE]
TIMED_FIRST, SAMPLE_EVERY = 32, 16  # the hook's defaults (gemm_sampling.c): 16 is the adaptive period's shortest
LONG_PLAN = {"seconds": 600, "intervals_ms": [250, 500, 1000]}  # --long-seconds, --intervals
WARM_CALLS, STEADY_CALLS = 64, 400  # accuracy: per group, read the slot after each part
# ... the smaller GEMM's steady part: ~60 timed at 1 in 128. Its kernel (~0.1 ms) outlasts the loop's host
# time per call, so the GPU stays busy and the program's events time the kernel, not launch gaps (a
# 2048^3 mm, 26 us, left the GPU idle between calls: both sides then time host latency, differently)
SMALL_STEADY_CALLS = 8000
OVERHEAD_PAIRS, OVERHEAD_STEPS, OVERHEAD_WARMUP = 10, 300, 30
# overhead-alternating: chunks each process runs before the pairs, not counted. Run 6's first pair
# (no such chunk) had the plain process's first chunk 3 % slower than any later one: the GPU had sat
# idle while the hooked process started, and a 30-step warm-up does not bring its clocks back.
ALTERNATING_WARMUP_CHUNKS = 1
STEP_SIZES = {"30ms": 6144, "5ms": 1024}  # batch rows through 8 bf16 Linear(8192, 8192)
SIZES_ENV = "RANK_FIGURES_SIZES"  # the step sizes an overhead worker runs (``--sizes``, comma-separated)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "PYTHONUNBUFFERED": "1"}


def free_ports(n: int) -> list[int]:
    """n distinct free ports (all held open while chosen, so none is handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def under_tuiprof(worker: str, out: pathlib.Path, *options: str, agent_port: int | None = None) -> list[str]:
    agent = ["--agent-port", str(agent_port)] if agent_port else ["--no-kineto-daemon"]
    return [*TUIPROF_RUN, *agent, *options, "--", sys.executable, __file__, "worker", "--worker", worker,
            "--out", str(out)]


def plain(worker: str, out: pathlib.Path) -> list[str]:
    return [sys.executable, __file__, "worker", "--worker", worker, "--out", str(out)]


def timed_call(c: int, first: int = TIMED_FIRST, every: int = SAMPLE_EVERY) -> bool:
    """The hook's rule for call c (1-based) of a shape."""
    return c <= first or (c - first) % every == 0


def own_segment():
    """This process's segment, everything submitted so far folded in."""
    from tuiprof_native import segment
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_flush(5000)
    lib.tuiprof_segment_path.restype = ctypes.c_char_p
    return segment.Segment(lib.tuiprof_segment_path().decode())


# ---------------------------------------------------------------- workers (inside the measured process)

def worker_accuracy(out: pathlib.Path) -> None:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    bf = {"device": "cuda", "dtype": torch.bfloat16}
    a, b = torch.randn(8192, 8192, **bf), torch.randn(8192, 8192, **bf)
    x, w, bias = torch.randn(4096, 8192, **bf), torch.randn(6144, 8192, **bf), torch.randn(6144, **bf)
    ba, bb = torch.randn(32, 2048, 2048, **bf), torch.randn(32, 2048, 2048, **bf)
    fa, fb = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    sa, sb = torch.randn(3072, 3072, **bf), torch.randn(3072, 3072, **bf)
    groups = {
        "mm_bf16": (lambda: torch.mm(a, b), 2 * 8192**3, "bf16", STEADY_CALLS),
        "linear_bias_bf16": (lambda: F.linear(x, w, bias), 2 * 4096 * 8192 * 6144, "bf16", STEADY_CALLS),
        "bmm_bf16": (lambda: torch.bmm(ba, bb), 2 * 32 * 2048**3, "bf16", STEADY_CALLS),
        "mm_fp32": (lambda: torch.mm(fa, fb), 2 * 4096**3, "fp32", STEADY_CALLS),
        "mm_small_bf16": (lambda: torch.mm(sa, sb), 2 * 3072**3, "bf16", SMALL_STEADY_CALLS),
    }
    result = {}
    for name, (fn, flops, dtype, steady_calls) in groups.items():
        seconds, readings = [], []
        for calls in (WARM_CALLS, steady_calls):  # the slot is read after each part, as agentd reads it
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(calls)]
            for start, end in pairs:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            seconds += [s.elapsed_time(e) / 1e3 for s, e in pairs]
            with own_segment() as seg:
                readings.append([_slot_json(s) for s in seg.slots() if s.kind == "gemm" and s.dtype == dtype
                                 and s.count and s.flops // s.count == flops])
        result[name] = {"seconds": seconds, "flops_per_call": flops, "dtype": dtype, "readings": readings}
    with own_segment() as seg:
        header = seg.header()
    (out / "accuracy_worker.json").write_text(json.dumps({
        "groups": result, "sample_every": header.gemm_sample_every, "sample_max": header.gemm_sample_max,
        "timed_first": header.gemm_timed_first,
        "gemm_untimed": header.counters.gemm_untimed, "dropped": header.counters.dropped_records}))


def _slot_json(s) -> dict:
    return {"op": s.op, "count": s.count, "timed_count": s.timed_count, "total_ns": s.total_ns,
            "timed_flops": s.timed_flops, "weighted_total_ns": s.weighted_total_ns,
            "weighted_timed_flops": s.weighted_timed_flops, "first_call_ns": s.first_call_ns,
            "sample_every": s.sample_every}


def program_anchor(torch, tries: int = 50) -> tuple[object, int, int]:
    """The program's own GPU-clock anchor: an event on an idle side stream, the host clock read around
    it until it completes; the narrowest window's midpoint. Returns (event, cpu ns, window ns)."""
    side = torch.cuda.Stream()
    best: tuple[int, object, int] | None = None
    for _ in range(tries):
        event = torch.cuda.Event(enable_timing=True)
        t0 = time.time_ns()
        event.record(side)
        while not event.query():
            pass
        t2 = time.time_ns()
        if best is None or t2 - t0 < best[0]:
            best = (t2 - t0, event, t0 + (t2 - t0) // 2)
    assert best is not None
    return best[1], best[2], best[0]


def worker_timeline(out: pathlib.Path) -> None:
    import torch

    bf = {"device": "cuda", "dtype": torch.bfloat16}
    a, b = torch.randn(8192, 8192, **bf), torch.randn(8192, 8192, **bf)
    for _ in range(3):  # the first call (module loading) and a little warm-up
        torch.mm(a, b)
    torch.cuda.synchronize()
    anchor, anchor_ns, window_ns = program_anchor(torch)
    calls = 200
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for start, end in pairs:
        start.record()
        torch.mm(a, b)
        end.record()
    torch.cuda.synchronize()
    own = [(anchor_ns + round(anchor.elapsed_time(s) * 1e6), anchor_ns + round(anchor.elapsed_time(e) * 1e6))
           for s, e in pairs]
    with own_segment() as seg:
        events = list(seg.events(kind="gemm"))
        header = seg.header()
    from agentd.traces.timeline import chrome_trace
    document = chrome_trace(events, header, socket.gethostname())
    (out / "timeline_worker.json").write_text(json.dumps({
        "own": own, "anchor_window_ns": window_ns, "stream": torch.cuda.current_stream().cuda_stream,
        "events": [{"start": e.start_ns, "end": e.end_ns, "stream": e.stream, "first": e.first_call,
                    "flops": e.flops} for e in events],
        "trace": document}))


def worker_eventcost(out: pathlib.Path) -> None:
    """GPU time of a loop of small GEMMs between two outer events (the hook decides what it times)."""
    import torch

    bf = {"device": "cuda", "dtype": torch.bfloat16}
    a, b = torch.randn(2048, 2048, **bf), torch.randn(2048, 2048, **bf)  # ~25 us each: the GPU, not the host, is busy
    for _ in range(64):  # past the 32 always-timed calls of the shape
        torch.mm(a, b)
    torch.cuda.synchronize()
    calls, rounds = 4000, 5
    totals = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(50e6))  # a head start for the host, so no launch gap shows on the GPU
        start.record()
        for _ in range(calls):
            torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        totals.append(start.elapsed_time(end) / 1e3)
    (out / f"eventcost_{os.environ.get('TUIPROF_GEMM_SAMPLE_EVERY', 'plain')}.json").write_text(json.dumps({
        "calls": calls, "seconds": totals}))


def training_step(batch: int):
    """A bf16 step: 8 Linear(8192, 8192) forward + backward + SGD (no synchronisation inside)."""
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(batch, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()
    return step


def timed_steps(step, steps: int) -> float:
    """ms per step over ``steps`` steps, the GPU drained before and after."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def training_step_loop(batch: int, steps: int, warmup: int) -> float:
    step = training_step(batch)
    for _ in range(warmup):
        step()
    return timed_steps(step, steps)


def step_sizes() -> list[str]:
    return os.environ.get(SIZES_ENV, ",".join(STEP_SIZES)).split(",")


def worker_overhead(out: pathlib.Path) -> None:
    result = {size: training_step_loop(STEP_SIZES[size], OVERHEAD_STEPS, OVERHEAD_WARMUP) for size in step_sizes()}
    (out / "overhead_worker.json").write_text(json.dumps(result))


def worker_overhead_chunks(out: pathlib.Path) -> None:
    """One process for the whole alternating run: warm up once, then a chunk of OVERHEAD_STEPS steps
    for each line read on stdin, its ms per step printed as ``CHUNK <ms>``; ends at EOF."""
    step = training_step(STEP_SIZES[step_sizes()[0]])
    for _ in range(OVERHEAD_WARMUP):
        step()
    print("READY", flush=True)
    for _ in sys.stdin:
        print(f"CHUNK {timed_steps(step, OVERHEAD_STEPS)}", flush=True)


def worker_long(out: pathlib.Path) -> None:
    import torch

    bf = {"device": "cuda", "dtype": torch.bfloat16}
    a, b = torch.randn(1024, 1024, **bf), torch.randn(1024, 1024, **bf)
    calls, end = 0, time.monotonic() + LONG_PLAN["seconds"]
    while time.monotonic() < end:
        for _ in range(4):
            torch.mm(a, b)
        calls += 4
        torch.cuda.synchronize()
        time.sleep(0.01)
    ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_flush(5000)
    (out / "long_worker.json").write_text(json.dumps({"calls": calls, "pid": os.getpid()}))
    time.sleep(5)  # the agents publish the last calls


WORKERS = {"accuracy": worker_accuracy, "timeline": worker_timeline, "eventcost": worker_eventcost,
           "overhead": worker_overhead, "overhead-chunks": worker_overhead_chunks, "long": worker_long}


# ---------------------------------------------------------------- phases (the driver)

def run_checked(cmd: list[str], out: pathlib.Path, name: str, timeout: float = 300, **kw) -> None:
    done = subprocess.run(cmd, env=kw.pop("env", env()), capture_output=True, text=True, timeout=timeout, **kw)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")


def phase_accuracy(out: pathlib.Path) -> dict:
    """Per group: the whole burst (ours as agentd estimates it, each timed call weighted by the calls
    it stands for; the plain mean over the timed calls for comparison; the program's over all calls
    and over the same calls), and the steady part after the first WARM_CALLS, the way agentd turns
    two readings of the segment into an interval's TFLOPS."""
    run_checked(under_tuiprof("accuracy", out), out, "accuracy_worker")
    own = json.loads((out / "accuracy_worker.json").read_text())
    first = own["timed_first"]
    rows = []
    for name, g in own["groups"].items():
        seconds, flops = g["seconds"], g["flops_per_call"]
        [warm], [slot] = g["readings"]
        # the shape's period; which calls were timed is known only while it stayed at the shortest
        # (an adaptive period moves once the hook has folded the first calls' times)
        every = slot["sample_every"]
        fixed_rule = every == own["sample_every"]

        def program(calls: list[int], flops: float = flops, seconds: list[float] = seconds) -> float:
            return flops * len(calls) / sum(seconds[i] for i in calls) / 1e12

        everything = range(1, len(seconds))  # the first call (module loading) is apart on both sides
        steady = range(WARM_CALLS, len(seconds))
        ours_steady = ((slot["weighted_timed_flops"] - warm["weighted_timed_flops"])
                       / ((slot["weighted_total_ns"] - warm["weighted_total_ns"]) / 1e9) / 1e12)
        ours_all = slot["weighted_timed_flops"] / (slot["weighted_total_ns"] / 1e9) / 1e12
        unweighted_all = slot["timed_flops"] / (slot["total_ns"] / 1e9) / 1e12
        rows.append({
            "group": name, "op": slot["op"], "calls_program": len(seconds), "count_ours": slot["count"],
            "sample_every": every, "timed_ours": slot["timed_count"],
            "timed_expected": sum(timed_call(i + 1, first, every) for i in everything) if fixed_rule else None,
            "steady_tflops_ours": ours_steady, "steady_tflops_program": program(list(steady)),
            "steady_diff_percent": 100 * (ours_steady / program(list(steady)) - 1),
            "steady_diff_same_calls_percent": 100 * (ours_steady / program(
                [i for i in steady if timed_call(i + 1, first, every)]) - 1) if fixed_rule else None,
            "burst_tflops_ours": ours_all, "burst_tflops_program": program(list(everything)),
            "burst_diff_percent": 100 * (ours_all / program(list(everything)) - 1),
            "burst_tflops_unweighted": unweighted_all,
            "burst_unweighted_diff_percent": 100 * (unweighted_all / program(list(everything)) - 1),
            "burst_unweighted_diff_same_calls_percent": 100 * (unweighted_all / program(
                [i for i in everything if timed_call(i + 1, first, every)]) - 1) if fixed_rule else None,
            "first_call_ms_ours": (slot["first_call_ns"] or 0) / 1e6, "first_call_ms_program": seconds[0] * 1e3})
    return {"sample_every": own["sample_every"], "sample_max": own["sample_max"], "timed_first": first,
            "warm_calls": WARM_CALLS, "steady_calls": STEADY_CALLS, "small_steady_calls": SMALL_STEADY_CALLS,
            "gemm_untimed": own["gemm_untimed"], "dropped": own["dropped"], "rows": rows}


def phase_timeline(out: pathlib.Path) -> dict:
    run_checked(under_tuiprof("timeline", out, "--gemm-sample-every", "1"), out, "timeline_worker")
    w = json.loads((out / "timeline_worker.json").read_text())
    own = w["own"]
    mine = [e for e in w["events"] if e["stream"] == w["stream"] and not e["first"]][-len(own):]
    assert len(mine) == len(own), (len(mine), len(own))
    offsets = [m["start"] - o[0] for m, o in zip(mine, own, strict=True)]
    base = statistics.median(offsets)
    overlaps = 0
    lanes: dict[int, list] = {}
    for event in w["trace"]["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "first_call"):
            lanes.setdefault(event["tid"], []).append((event["ts"], event["ts"] + event["dur"]))
    for lane in lanes.values():
        lane.sort()
        overlaps += sum(1 for x, y in pairwise(lane) if y[0] < x[1])

    def idle_percent(spans: list[tuple[int, int]]) -> float:
        span = spans[-1][1] - spans[0][0]
        busy, reach = 0, spans[0][0]
        for s, e in spans:
            s = max(s, reach)
            busy += max(0, e - s)
            reach = max(reach, e)
        return 100 * (span - busy) / span

    ours_idle = idle_percent([(m["start"], m["end"]) for m in mine])
    own_idle = idle_percent([tuple(o) for o in own])
    return {"calls": len(own), "overlapping_slices": overlaps, "lanes": len(lanes),
            "start_minus_program_ns": {"median": base, "min": min(offsets), "max": max(offsets)},
            "start_minus_program_after_median_ns": {"min": min(offsets) - base, "max": max(offsets) - base},
            "within_5us": sum(1 for d in offsets if abs(d) <= 5000),
            "over_5us": [(i, d, mine[i]["end"] - mine[i]["start"], own[i][1] - own[i][0])
                         for i, d in enumerate(offsets) if abs(d) > 5000],
            "program_anchor_window_ns": w["anchor_window_ns"],
            "idle_percent_ours": ours_idle, "idle_percent_program": own_idle,
            "idle_diff_points": ours_idle - own_idle}


def phase_eventcost(out: pathlib.Path) -> dict:
    result = {}
    for every in ("1", "1000000"):
        run_checked(under_tuiprof("eventcost", out, "--gemm-sample-every", every), out, f"eventcost_{every}")
        result[every] = json.loads((out / f"eventcost_{every}.json").read_text())
    run_checked(plain("eventcost", out), out, "eventcost_plain")
    result["plain"] = json.loads((out / "eventcost_plain.json").read_text())
    calls = result["1"]["calls"]
    med = {k: statistics.median(v["seconds"]) for k, v in result.items()}
    return {"calls_per_loop": calls, "median_loop_seconds": med,
            "gpu_us_per_timed_call": (med["1"] - med["1000000"]) / calls * 1e6,
            "gpu_us_per_counted_call": (med["1000000"] - med["plain"]) / calls * 1e6}


def long_dir() -> pathlib.Path:
    return pathlib.Path("/tmp/rank_figures_long")


def phase_long_start(out: pathlib.Path) -> dict:
    """Three agents, a recorder each, and the 10-minute job, in a new session so they outlive this
    device call; the session's script stops its agents once the job and the recorders are done."""
    d = long_dir()
    d.mkdir(parents=True, exist_ok=True)
    intervals, seconds = LONG_PLAN["intervals_ms"], LONG_PLAN["seconds"]
    chosen = free_ports(2 * len(intervals))
    ports = dict(zip(intervals, chosen[::2], strict=True))
    metrics = dict(zip(intervals, chosen[1::2], strict=True))
    agentd = f"{sys.executable} -c '{AGENTD_CODE}'"
    tuiprof_run = " ".join(TUIPROF_RUN)
    script = ["set -u", "agents=", "recorders="]
    for ms, port in ports.items():
        script.append(f"{agentd} --port {port} --metrics-port {metrics[ms]} --interval-ms {ms} "
                      f"--trace-dir {d}/traces{ms} > {d}/agentd{ms}.log 2>&1 & agents=\"$agents $!\"")
    script.append("sleep 4")
    for ms, port in ports.items():
        script.append(f"{sys.executable} {__file__} watch --port {port} --seconds {seconds + 20} "
                      f"--out {d}/snapshots{ms}.ndjson > {d}/record{ms}.log 2>&1 & recorders=\"$recorders $!\"")
    script.append("sleep 2")
    script.append(f"{tuiprof_run} --agent-port {ports[intervals[0]]} -- {sys.executable} {__file__} worker "
                  f"--worker long --long-seconds {seconds} --out {d} > {d}/job.log 2>&1; echo $? > {d}/job.rc")
    script.append("wait $recorders")
    script.append("kill $agents")
    script.append("wait")
    script.append(f"touch {d}/done")
    (d / "run.sh").write_text("\n".join(script) + "\n")
    (d / "plan.json").write_text(json.dumps(LONG_PLAN))
    with open(d / "run.log", "w") as log:
        subprocess.Popen(["bash", str(d / "run.sh")], env=env(), stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return {"ports": ports, "dir": str(d), "plan": LONG_PLAN, "started_unix": time.time()}


def phase_long_collect(out: pathlib.Path) -> dict:
    d = long_dir()
    deadline = time.time() + LONG_PLAN["seconds"] + 120
    while not (d / "done").exists() and time.time() < deadline:
        time.sleep(2)
    job = json.loads((d / "long_worker.json").read_text())
    report: dict = {"job_calls": job["calls"], "job_rc": (d / "job.rc").read_text().strip(),
                    "done": (d / "done").exists(), "agents": {}}
    plan = json.loads((d / "plan.json").read_text())
    report["seconds"] = plan["seconds"]
    for ms in plan["intervals_ms"]:
        report["agents"][str(ms)] = intervals_of(d / f"snapshots{ms}.ndjson", job["pid"], job["calls"])
    return report


def intervals_of(path: pathlib.Path, pid: int, calls: int) -> dict:
    """Each published interval of the job's 1024^3 GEMM against the count it adds (lost / repeated)."""
    previous_total, previous_seq = 0, None
    lost = repeated = sequence_gaps = intervals = with_calls = 0
    counted = 0
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") != "snapshot":
            continue
        snap = event["snapshot"]
        seq = int(snap.get("sequence", 0))
        gap = previous_seq is not None and seq != previous_seq + 1
        previous_seq = seq
        sequence_gaps += gap
        for rank in snap.get("ranks", []):
            if rank["pid"] != pid:
                continue
            gemm = [g for g in rank.get("gemm", []) if g.get("shape") == "b=1 m=1024 n=1024 k=1024"]
            if not gemm or "interval_seconds" not in rank:
                continue
            total = int(gemm[0].get("count_total", 0))
            in_interval = round(gemm[0].get("count_per_s", 0.0) * rank["interval_seconds"])
            intervals += 1
            with_calls += in_interval > 0
            if not gap:
                lost += in_interval < total - previous_total
                repeated += in_interval > total - previous_total
            counted += in_interval
            previous_total = total
    return {"intervals": intervals, "intervals_with_calls": with_calls, "lost": lost, "repeated": repeated,
            "snapshot_sequence_gaps": sequence_gaps, "final_count_total": previous_total, "job_calls": calls,
            "sum_of_intervals": counted}


def phase_overhead(out: pathlib.Path, pairs: int = OVERHEAD_PAIRS) -> dict:
    port, metrics = free_ports(2)
    with open(out / "agentd.log", "w") as log:
        agent = subprocess.Popen([*AGENTD, "--port", str(port), "--metrics-port", str(metrics), "--interval-ms",
                                  "500", "--trace-dir", str(out / "traces")], env=env(), stdout=log,
                                 stderr=subprocess.STDOUT)
    runs: dict[str, list[dict]] = {"plain": [], "tuiprof": []}
    try:
        time.sleep(3)
        for pair in range(pairs):
            order = ("plain", "tuiprof") if pair % 2 == 0 else ("tuiprof", "plain")
            for label in order:
                cmd = plain("overhead", out) if label == "plain" else under_tuiprof("overhead", out, agent_port=port)
                run_checked(cmd, out, f"overhead_{label}_{pair}")
                runs[label].append(json.loads((out / "overhead_worker.json").read_text()))
                print(f"overhead pair {pair} {label} {json.dumps(runs[label][-1])}", flush=True)  # survives a timeout
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    sizes = step_sizes()
    return {"pairs": pairs, "steps": OVERHEAD_STEPS, "batches": {size: STEP_SIZES[size] for size in sizes},
            "sizes": {size: paired(runs, size) for size in sizes}}


def phase_overhead_alternating(out: pathlib.Path, pairs: int, seconds: float) -> dict:
    """Two long-lived processes of the same step, one plain and one under `tuiprof run` (agentd
    running), each warmed up once, then chunks of OVERHEAD_STEPS steps run one process at a time,
    pairs in ABBA order (plain-tuiprof, tuiprof-plain, …) so a slow drift of the GPU's clock or
    temperature falls on both sides alike; no process start, CUDA set-up or cuBLAS loading inside
    a pair. Stops after ``pairs`` pairs or when the next pair would pass ``seconds``."""
    port, metrics = free_ports(2)
    with open(out / "agentd.log", "w") as log:
        agent = subprocess.Popen([*AGENTD, "--port", str(port), "--metrics-port", str(metrics), "--interval-ms",
                                  "500", "--trace-dir", str(out / "traces")], env=env(), stdout=log,
                                 stderr=subprocess.STDOUT)
    workers: dict[str, subprocess.Popen] = {}
    runs: dict[str, list[dict]] = {"plain": [], "tuiprof": []}
    warmup: dict[str, list[float]] = {"plain": [], "tuiprof": []}
    size = step_sizes()[0]
    started = time.monotonic()
    try:
        time.sleep(3)
        for label in ("plain", "tuiprof"):
            cmd = plain("overhead-chunks", out) if label == "plain" else under_tuiprof(
                "overhead-chunks", out, agent_port=port)
            with open(out / f"overhead_chunks_{label}.log", "w") as log:
                workers[label] = subprocess.Popen(cmd, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=log, text=True)
            read_line(workers[label], "READY")
        for label in ("plain", "tuiprof"):  # one chunk each, not counted: see ALTERNATING_WARMUP_CHUNKS
            for _ in range(ALTERNATING_WARMUP_CHUNKS):
                workers[label].stdin.write("run\n")
                workers[label].stdin.flush()
                warmup[label].append(float(read_line(workers[label], "CHUNK")))
        pair_seconds = 0.0
        for pair in range(pairs):
            if time.monotonic() - started + pair_seconds > seconds:
                break
            pair_started = time.monotonic()
            for label in ("plain", "tuiprof") if pair % 2 == 0 else ("tuiprof", "plain"):
                workers[label].stdin.write("run\n")
                workers[label].stdin.flush()
                runs[label].append({size: float(read_line(workers[label], "CHUNK"))})
            pair_seconds = time.monotonic() - pair_started
            print(f"overhead pair {pair} plain {runs['plain'][-1][size]:.4f} tuiprof {runs['tuiprof'][-1][size]:.4f}",
                  flush=True)  # survives a timeout
    finally:
        for worker in workers.values():
            worker.stdin.close()
            worker.wait(timeout=60)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    return {"design": "alternating chunks, ABBA", "warmup_chunks_ms": warmup, "pairs": len(runs["plain"]),
            "steps": OVERHEAD_STEPS,
            "batches": {size: STEP_SIZES[size]}, "sizes": {size: paired(runs, size)}}


def read_line(worker: subprocess.Popen, tag: str) -> str:
    """The rest of the worker's next stdout line that starts with ``tag`` (other lines skipped)."""
    for line in worker.stdout:
        if line.startswith(tag):
            return line[len(tag):].strip()
    raise SystemExit(f"worker ended before {tag} (exit {worker.wait()}); see its log")


def combine_overhead(inputs: list[pathlib.Path]) -> dict:
    """The pairs of several overhead runs as one set (each run's plain/tuiprof times, in order)."""
    runs = [json.loads(path.read_text()) for path in inputs]
    sizes = [size for size in STEP_SIZES if all(size in run["sizes"] for run in runs)]
    combined = {}
    for size in sizes:
        times = {label: [t for run in runs for t in run["sizes"][size][f"{label}_ms"]] for label in ("plain", "tuiprof")}
        combined[size] = paired({label: [{size: t} for t in ts] for label, ts in times.items()}, size)
    return {"inputs": [str(path) for path in inputs], "pairs": sum(run["pairs"] for run in runs),
            "steps": OVERHEAD_STEPS, "sizes": combined}


def paired(runs: dict[str, list[dict]], size: str) -> dict:
    p = [r[size] for r in runs["plain"]]
    t = [r[size] for r in runs["tuiprof"]]
    diffs = [100 * (b - a) / a for a, b in zip(p, t, strict=True)]
    rng = random.Random(13)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(20000))
    return {"plain_ms": p, "tuiprof_ms": t, "diff_percent": diffs, "mean": statistics.fmean(diffs),
            "median": statistics.median(diffs), "ci95": [means[int(0.025 * len(means))], means[int(0.975 * len(means))]],
            "plain_median_ms": statistics.median(p)}


def watch(port: int, seconds: float, path: pathlib.Path) -> None:
    """Every snapshot the agent on ``port`` publishes for ``seconds``, one JSON line each (as `tuiprof
    record` writes them), through the agent's Watch stream."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from agentd.proto import tuiprof_agent_pb2 as pb
    from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, path.open("w") as out:
        try:
            for snapshot in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=seconds,
                                                             wait_for_ready=True):
                out.write(json.dumps({"event": "snapshot", "snapshot": MessageToDict(
                    snapshot, preserving_proto_field_name=True)}) + "\n")
                out.flush()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise


PHASES = {"accuracy": phase_accuracy, "timeline": phase_timeline, "eventcost": phase_eventcost,
          "long-start": phase_long_start, "long-collect": phase_long_collect, "overhead": phase_overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=[*PHASES, "overhead-alternating", "overhead-combine", "worker", "watch"])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help="overhead-alternating: stop before a pair would pass it")
    parser.add_argument("--long-seconds", type=int, default=LONG_PLAN["seconds"])
    parser.add_argument("--intervals", type=int, nargs="+", default=LONG_PLAN["intervals_ms"], metavar="MS")
    parser.add_argument("--pairs", type=int, default=OVERHEAD_PAIRS, help="overhead: interleaved pairs")
    parser.add_argument("--sizes", nargs="+", choices=list(STEP_SIZES), help="overhead: step sizes (default all)")
    parser.add_argument("--inputs", type=pathlib.Path, nargs="+", help="overhead-combine: overhead.json files")
    args = parser.parse_args()
    if args.sizes:
        os.environ[SIZES_ENV] = ",".join(args.sizes)  # the workers inherit it
    LONG_PLAN.update(seconds=args.long_seconds, intervals_ms=args.intervals)
    if args.phase == "watch":
        watch(args.port, args.seconds, args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "worker":
        WORKERS[args.worker](args.out)
        return
    if args.phase == "overhead-combine":
        result = combine_overhead(args.inputs)
    elif args.phase == "overhead":
        result = phase_overhead(args.out, args.pairs)
    elif args.phase == "overhead-alternating":
        result = phase_overhead_alternating(args.out, args.pairs, args.seconds or 480)
    else:
        result = PHASES[args.phase](args.out)
    (args.out / f"{args.phase}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({args.phase: result}, indent=2)[:6000])


if __name__ == "__main__":
    main()
