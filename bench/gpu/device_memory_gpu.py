"""One GPU: device memory figures (issue 30 item 2) against what a torch job counts itself.

Two jobs under `tuiprof run`, each watched through agentd's /metrics:

- ``runtime``: with PYTORCH_NO_CUDA_MEMORY_CACHING=1 every allocation of PyTorch's allocator is one
  cudaMalloc of exactly its size and every free one cudaFree, so the job knows its calls and bytes.
  Between two marks (the job waits at each while the driver scrapes) it allocates and frees
  ALLOCATIONS blocks through torch.cuda.caching_allocator_alloc/delete and copies preallocated
  tensors host to device, device to host and device to device (``copy_``: one cudaMemcpyAsync each,
  nothing allocated). The agent's counts between the marks must equal the job's exactly.
- ``allocator``: with the caching allocator on, the job trains a few optimizer steps, waits past the
  startup hook's one-second limit, takes one more step (the hook publishes at it) and reads
  torch.cuda.memory_stats() right after; the agent's tuiprof_rank_torch_* must equal those figures.

    python bench/gpu/device_memory_gpu.py --out DIR     # on the GPU machine, from the checkout

The report (DIR/report.json, printed) lists every figure as ours / the program's with ``equal``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
AGENTD = [sys.executable, "-c", "import sys; from agentd.cli import main; sys.exit(main())"]
RUN = [sys.executable, str(ROOT / "bench" / "gpu" / "tuiprof_headless.py"), "run", "--no-kineto-daemon", "--"]
ALLOCATIONS = 100
COPIES = {"host_to_device": 50, "device_to_host": 20, "device_to_device": 30}
COPY_BYTES = 4 << 20
INTERVAL_MS = 500
SETTLE_SECONDS = 2.0  # a few agent intervals: the figures of what the job did are published
MARKS = ("runtime-before", "runtime-after", "allocator")
SERIES = re.compile(r'^(tuiprof_rank_[a-z_]+)\{([^}]*)\} (\S+)$')


# ---------------------------------------------------------------- the jobs


def _wait_for(path: pathlib.Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def _mark(out: pathlib.Path, name: str, figures: dict) -> None:
    """Tell the driver where the job is (with its own figures), and wait until it scraped."""
    (out / f"{name}.json").write_text(json.dumps({"pid": os.getpid(), **figures}))
    _wait_for(out / f"{name}.go")


def runtime_job(out: pathlib.Path) -> None:
    import torch

    assert os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1", "run by the driver, which sets it"
    host = {d: torch.ones(COPY_BYTES // 4, dtype=torch.float32) for d in ("host_to_device", "device_to_host")}
    device = {d: torch.ones(COPY_BYTES // 4, dtype=torch.float32, device="cuda") for d in COPIES}
    source = torch.ones(COPY_BYTES // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    _mark(out, "runtime-before", {})
    sizes = [(i + 1) * 1024 * 1024 + 512 * i for i in range(ALLOCATIONS)]
    stream = torch.cuda.current_stream()
    for size in sizes:
        pointer = torch.cuda.caching_allocator_alloc(size, stream=stream)
        torch.cuda.caching_allocator_delete(pointer)
    for _ in range(COPIES["host_to_device"]):
        device["host_to_device"].copy_(host["host_to_device"])
    for _ in range(COPIES["device_to_host"]):
        host["device_to_host"].copy_(device["device_to_host"])
    for _ in range(COPIES["device_to_device"]):
        device["device_to_device"].copy_(source)
    torch.cuda.synchronize()
    _mark(out, "runtime-after", {
        "malloc_calls": len(sizes), "malloc_bytes": sum(sizes), "free_calls": len(sizes), "free_bytes": sum(sizes),
        "copies": {d: {"calls": n, "bytes": n * COPY_BYTES} for d, n in COPIES.items()},
    })


def allocator_job(out: pathlib.Path) -> None:
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    batch = torch.randn(256, 2048, device="cuda")

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()  # the startup hook's post-step hook publishes here (at most once a second)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    time.sleep(1.2)  # past the startup hook's one-second limit: the next step publishes
    step()
    stats = torch.cuda.memory_stats()  # right after: nothing allocated since the hook read them
    _mark(out, "allocator", {
        "allocated_bytes": stats["allocated_bytes.all.current"], "reserved_bytes": stats["reserved_bytes.all.current"],
        "peak_allocated_bytes": stats["allocated_bytes.all.peak"], "alloc_retries_total": stats["num_alloc_retries"],
        "ooms_total": stats["num_ooms"],
    })


# ---------------------------------------------------------------- the driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(metrics_port: int, pid: int) -> dict[tuple[str, str], float]:
    """The rank's device memory series: (name, the label that tells them apart: api or direction) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if not match or f'pid="{pid}"' not in match.group(2):
            continue
        name, labels, value = match.groups()
        if not name.startswith(("tuiprof_rank_device_", "tuiprof_rank_memcpy_", "tuiprof_rank_torch_")):
            continue
        which = re.search(r'(?:api|direction)="([^"]*)"', labels)
        found[(name, which.group(1) if which else "")] = float(value)
    return found


def _job(out: pathlib.Path, mode: str, env: dict[str, str]) -> subprocess.Popen:
    log = open(out / f"{mode}.log", "w")  # noqa: SIM115 -- the job's whole life
    return subprocess.Popen([*RUN, sys.executable, __file__, "--job", mode, "--out", str(out)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _at_mark(out: pathlib.Path, name: str, metrics_port: int) -> tuple[dict, dict]:
    _wait_for(out / f"{name}.json")
    time.sleep(SETTLE_SECONDS)
    own = json.loads((out / f"{name}.json").read_text())
    ours = scrape(metrics_port, own["pid"])
    (out / f"{name}.go").touch()
    return own, ours


def _figure(ours: float | None, program: float) -> dict:
    return {"ours": ours, "program": program, "equal": ours == program}


def compare_runtime(before: dict, after: dict, own: dict) -> dict:
    def delta(name: str, which: str) -> float | None:
        if (name, which) not in after:
            return None
        return after[(name, which)] - before.get((name, which), 0.0)

    report = {
        "malloc_calls": _figure(delta("tuiprof_rank_device_malloc_calls_total", "malloc"), own["malloc_calls"]),
        "malloc_bytes": _figure(delta("tuiprof_rank_device_malloc_bytes_total", "malloc"), own["malloc_bytes"]),
        "free_calls": _figure(delta("tuiprof_rank_device_free_calls_total", "malloc"), own["free_calls"]),
        "free_bytes": _figure(delta("tuiprof_rank_device_free_bytes_total", "malloc"), own["free_bytes"]),
    }
    for direction, counts in own["copies"].items():
        report[f"{direction}_calls"] = _figure(delta("tuiprof_rank_memcpy_calls_total", direction), counts["calls"])
        report[f"{direction}_bytes"] = _figure(delta("tuiprof_rank_memcpy_bytes_total", direction), counts["bytes"])
        seconds, calls = delta("tuiprof_rank_memcpy_seconds_total", direction), counts["calls"]
        report[f"{direction}_mean_seconds_ours"] = seconds / calls if seconds is not None else None
    return report


def compare_allocator(ours: dict, own: dict) -> dict:
    return {field: _figure(ours.get((f"tuiprof_rank_torch_{field}", "")), own[field])
            for field in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "alloc_retries_total",
                          "ooms_total")}


def driver(out: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    port, metrics_port = _free_port(), _free_port()
    with open(out / "agentd.log", "w") as log:
        agent = subprocess.Popen([*AGENTD, "--port", str(port), "--metrics-port", str(metrics_port),
                                  "--interval-ms", str(INTERVAL_MS), "--trace-dir", str(out / "traces")],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
    for stale in (*out.glob("*.go"), *(out / f"{mark}.json" for mark in MARKS)):
        stale.unlink(missing_ok=True)  # a folder used before: its marks would let this run skip ahead
    report: dict = {}
    try:
        time.sleep(3)
        job = _job(out, "runtime", {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        _, before = _at_mark(out, "runtime-before", metrics_port)
        own, after = _at_mark(out, "runtime-after", metrics_port)
        report["runtime"] = compare_runtime(before, after, own)
        report["runtime_exit_code"] = job.wait(timeout=120)
        job = _job(out, "allocator", env)
        own, ours = _at_mark(out, "allocator", metrics_port)
        report["allocator"] = compare_allocator(ours, own)
        report["allocator_exit_code"] = job.wait(timeout=120)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    figures = [f for part in ("runtime", "allocator") for f in report.get(part, {}).values() if isinstance(f, dict)]
    report["all_equal"] = bool(figures) and all(f["equal"] for f in figures)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for the logs and report.json")
    parser.add_argument("--job", choices=("runtime", "allocator"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.job == "runtime":
        runtime_job(args.out)
    elif args.job == "allocator":
        allocator_job(args.out)
    else:
        driver(args.out)


if __name__ == "__main__":
    main()
