"""The hook's NCCL profiler plugin against real NCCL releases (issue 29 item 7): which profiler API
version each NCCL takes, and the segment's counts against the program's own.

For every ``libnccl.so.2`` found under ``--nccl-dir`` (e.g. unpacked ``nvidia-nccl-cu12`` wheels,
one release per folder: ``<dir>/<any>/nvidia/nccl/lib/libnccl.so.2``), a two-rank torch.distributed
NCCL job runs under ``tuiprof run`` with that library in ``LD_PRELOAD`` (PyTorch then uses it).
Both ranks share GPU 0: NCCL_HOSTID tells them apart as two hosts and they join over sockets on lo.
Each rank runs a fixed program (all-reduce, all-gather, reduce-scatter, broadcast, send/recv), counts
its own calls, and at the end reads its segment and asks the hook which profiler API NCCL took.

    python3 bench/gpu/nccl_profiler_versions.py --nccl-dir /path/to/nccls --out $OUT

Prints a table (NCCL version, profiler API chosen, per op: the program's count, the segment's) and
writes every rank's report to ``$OUT/nccl_profiler_versions.json``. ``--chain PLUGIN`` runs each job
with NCCL_PROFILER_PLUGIN=PLUGIN set before ``tuiprof run`` (the hook then chains to it).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from nccl_stubs import build_stubs

ROOT = pathlib.Path(__file__).resolve().parents[2]

# One rank: argv = rank, world, port, report path. Counts are per NCCL op the program launched.
WORKER = r"""
import collections, ctypes, json, os, pathlib, sys, time
import torch, torch.distributed as dist
from tuiprof_native import segment

rank, world, port, report = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], pathlib.Path(sys.argv[4])
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                        device_id=torch.device("cuda:0"))

def own_segment():
    found = [p for p in pathlib.Path(segment.SEGMENT_DIR).glob(f"{segment.SEGMENT_PREFIX}{os.getuid()}-{os.getpid()}-*")
             if (name := segment.parse_name(p.name)) and not name[2]]
    return found[0] if found else None

def segment_counts():
    path = own_segment()
    if path is None:
        return collections.Counter()
    with segment.Segment(path) as seg:
        return collections.Counter({s.op: s.count for s in seg.slots() if s.kind == "nccl"})

x = torch.ones(1 << 16, device="cuda")
dist.all_reduce(x)                      # warm-up: communicator made, plugin initialised
torch.cuda.synchronize()
time.sleep(0.5)
before = segment_counts()
program = collections.Counter()
gathered = torch.empty(world * x.numel(), device="cuda")
shard = torch.empty(x.numel() // world, device="cuda")
for step in range(20):
    dist.all_reduce(x); program["AllReduce"] += 1
    dist.all_gather_into_tensor(gathered, x); program["AllGather"] += 1
    dist.reduce_scatter_tensor(shard, x); program["ReduceScatter"] += 1
    dist.broadcast(x, src=step % world); program["Broadcast"] += 1
    if rank == 0:
        dist.send(x, dst=1); program["Send"] += 1
    elif rank == 1:
        dist.recv(x, src=0); program["Recv"] += 1
torch.cuda.synchronize()
deadline = time.monotonic() + 15
while time.monotonic() < deadline:          # the hook's writer folds what finished
    seen = segment_counts() - before
    if all(seen[op] >= n for op, n in program.items()):
        break
    time.sleep(0.2)
seen = segment_counts() - before
hook = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
hook.tuiprof_nccl_chain.restype = ctypes.c_char_p
version = ctypes.c_int()
nccl = ctypes.CDLL(os.environ["BENCH_LIBNCCL"])
nccl.ncclGetVersion(ctypes.byref(version))
header = None
if (path := own_segment()) is not None:
    with segment.Segment(path) as seg:
        h = seg.header()
        header = {"flags": h.flags, "nccl_untimed": h.counters.nccl_untimed,
                  "shortfall": h.counters.nccl_channel_shortfall, "late": h.counters.nccl_late_channels,
                  "nccl_profiler_api": h.nccl_profiler_api, "nccl_chain": h.nccl_chain}
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})
report.write_text(json.dumps({
    "rank": rank, "mapped": mapped, "nccl_version": version.value, "profiler_api": hook.tuiprof_nccl_profiler_version(),
    "chain": hook.tuiprof_nccl_chain().decode(), "program": program, "segment": dict(seen),
    "segment_extra": {op: n for op, n in seen.items() if op not in program}, "header": header,
}))
dist.barrier()
dist.destroy_process_group()
"""


def nccl_libraries(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("libnccl.so.2*") if p.is_file() and not p.is_symlink())


def run_job(lib: pathlib.Path, out: pathlib.Path, port: int, chain: str | None) -> list[dict[str, object]]:
    """The two ranks under `tuiprof run` with `lib` preloaded: their reports (or why there is none)."""
    env = dict(os.environ)
    stubs = build_stubs(lib, out / "stubs")  # an NCCL older than this PyTorch's lacks functions it binds
    env.update({"LD_PRELOAD": " ".join(map(str, filter(None, (lib, stubs)))), "BENCH_LIBNCCL": str(lib),
                "NCCL_SOCKET_IFNAME": "lo",
                "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))})
    if chain:
        env["NCCL_PROFILER_PLUGIN"] = chain
    else:
        env.pop("NCCL_PROFILER_PLUGIN", None)
    tag = lib.parent.as_posix().replace("/", "_").strip("_")
    procs, reports, logs = [], [], []
    for rank in range(2):
        report = out / f"{tag}-rank{rank}.json"
        report.unlink(missing_ok=True)
        log = out / f"{tag}-rank{rank}.log"
        cmd = [sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--",
               sys.executable, "-c", WORKER, str(rank), "2", str(port), str(report)]
        with open(log, "wb") as sink:
            procs.append(subprocess.Popen(cmd, env=env | {"NCCL_HOSTID": f"tuiprof-bench-{rank}"}, stdout=sink,
                                          stderr=subprocess.STDOUT))
        reports.append(report)
        logs.append(log)
    results: list[dict[str, object]] = []
    for proc, report, log in zip(procs, reports, logs, strict=True):
        try:
            code = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if report.exists():
            results.append(json.loads(report.read_text()) | {"exit": code, "log": str(log)})
        else:
            tail = log.read_text(errors="replace").splitlines()[-5:]
            results.append({"exit": code, "log": str(log), "error": " | ".join(tail)})
    return results


def version_text(code: object) -> str:
    if not isinstance(code, int) or code <= 0:
        return "?"
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def table(rows: list[tuple[str, list[dict[str, object]]]]) -> str:
    lines = [f"{'library':<40} {'NCCL':<8} {'API':<4} {'rank':<4} {'op':<14} {'program':>7} {'segment':>7}  match"]
    for lib, results in rows:
        for r in results:
            if "error" in r:
                lines.append(f"{lib:<40} {'-':<8} {'-':<4} {'-':<4} failed (exit {r['exit']}): {r['error']}")
                continue
            program, seen = r["program"], r["segment"]
            assert isinstance(program, dict) and isinstance(seen, dict)
            for op in sorted(set(program) | set(seen)):
                want, got = program.get(op, 0), seen.get(op, 0)
                lines.append(f"{lib:<40} {version_text(r['nccl_version']):<8} {r['profiler_api']!s:<4} "
                             f"{r['rank']!s:<4} {op:<14} {want:>7} {got:>7}  {'yes' if want == got else 'NO'}")
            if r.get("chain"):
                lines.append(f"{'':<40} chain: {r['chain']}")
            header = r.get("header")
            if isinstance(header, dict):  # what the agent reads: the segment header's copy
                lines.append(f"{'':<40} segment header: API {header['nccl_profiler_api']}, "
                             f"chain {header['nccl_chain']!r}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl-dir", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--chain", help="a profiler plugin to set in NCCL_PROFILER_PLUGIN first")
    parser.add_argument("--port", type=int, default=29541)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    libraries = nccl_libraries(args.nccl_dir)
    if not libraries:
        parser.error(f"no libnccl.so.2 under {args.nccl_dir}")
    rows = []
    for n, lib in enumerate(libraries):
        rows.append((str(lib.relative_to(args.nccl_dir)), run_job(lib, args.out, args.port + n, args.chain)))
    (args.out / "nccl_profiler_versions.json").write_text(json.dumps(
        [{"library": lib, "ranks": results} for lib, results in rows], indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
