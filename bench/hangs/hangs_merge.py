"""Merging 4096 ranks' stacks (60 frames each) the way tuiprof does, timed and measured.

Run: .venv/bin/python bench/hangs/hangs_merge.py [--ranks 4096] [--frames 60] [--per-host 8]

The stacks imitate a hung data-parallel job: a shared 40-frame prefix (launcher,
training loop, model code), then most ranks waiting inside all_reduce with
native frames whose addresses differ per process, a few ranks spread over
nearby line numbers, a handful in the garbage collector, and one rank stuck in
a DataLoader. Each rank also has a second thread (a watchdog) with a short stack.

Measured paths:
  flat       normalize + merge every raw stack at once (one process does it all)
  agent      one host: normalize + pre-merge its 8 ranks, serialize the tree
             (each agent does this in parallel; the figure is per host)
  console    parse every host's tree, convert, merge the trees
  report     project without line numbers (the CLI default), classes,
             suspects and the JSON document
Memory: tracemalloc peak of each path (a separate run, as tracing slows it).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import time
import tracemalloc
from types import SimpleNamespace

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks import ranksets
from agentd.stacks.merge import ThreadSample, merge, merge_trees, normalize_frames, project
from agentd.stacks.wire import tree_from_proto, tree_to_proto
from tuiprof.analysis.stacks_report import build_report, report_json


def raw(function, file="", line=0, native=False, module=""):
    return SimpleNamespace(function=function, file=file, line=line, native=native, module=module)


def job_stacks(ranks: int, frames: int, unique: bool, seed: int = 1) -> dict[int, list[tuple[str, list]]]:
    """rank -> [(thread name, raw frames outermost first)]; ``unique``: every rank's tail differs."""
    rnd = random.Random(seed)
    prefix_len = frames * 2 // 3
    prefix = [raw(f"0x7f00{i:04x}", native=True, module="/lib/libc.so.6") for i in range(2)]
    prefix += [raw(f"layer_{i}.forward" if i > 8 else f"train_loop_{i}", f"/job/model/part{i % 7}.py", 10 + i)
               for i in range(prefix_len - len(prefix))]
    tail_len = frames - prefix_len
    stacks = {}
    odd = rnd.randrange(ranks)
    gc_ranks = set(rnd.sample(range(ranks), 6))
    for rank in range(ranks):
        if rank == odd:
            tail = [raw("__next__", "/torch/utils/data/dataloader.py", 630),
                    raw("_next_data", "/torch/utils/data/dataloader.py", 1310),
                    raw("_get_data", "/torch/utils/data/dataloader.py", 1270),
                    raw("wait", "/usr/lib/python3.11/threading.py", 320)]
        elif rank in gc_ranks:
            tail = [raw("backward", "/torch/_tensor.py", 521), raw("collect", "gc", 0),
                    raw("gc_collect_main", native=True, module="/usr/lib/libpython3.11.so")]
        else:
            line = 2501 if rnd.random() < 0.9 else rnd.choice((2497, 2503, 2510))
            tail = [raw("all_reduce", "/torch/distributed/distributed_c10d.py", line),
                    raw("wrapper", "/torch/distributed/c10d_logger.py", 81)]
            tail += [raw("_PyEval_EvalFrameDefault", native=True, module="/usr/lib/libpython3.11.so")]
            for i in range(tail_len - len(tail)):
                name = f"c10d::ProcessGroupGloo::wait_{i}" + (f"_r{rank}" if unique else "")
                tail.append(raw(name, native=True, module="/torch/lib/libtorch_cpu.so"))
            tail[-1] = raw(f"0x7f{rnd.getrandbits(40):010x}", native=True, module="/lib/libc.so.6")
        watchdog = [raw("_bootstrap", "/usr/lib/python3.11/threading.py", 995),
                    raw("run", "/usr/lib/python3.11/threading.py", 975),
                    raw("watchdog_loop", "/job/train.py", 40)]
        stacks[rank] = [("MainThread", prefix + tail), ("watchdog", watchdog)]
    return stacks


def samples(stacks, ranks) -> list[ThreadSample]:
    return [ThreadSample(r, name, normalize_frames(frames)) for r in ranks for name, frames in stacks[r]]


def flat(stacks):
    return merge(samples(stacks, stacks))


def agents(stacks, per_host_ranks) -> list[bytes]:
    ranks = sorted(stacks)
    return [
        tree_to_proto(merge(samples(stacks, ranks[start:start + per_host_ranks]))).SerializeToString()
        for start in range(0, len(ranks), per_host_ranks)
    ]


def console(wires: list[bytes]):
    return merge_trees(tree_from_proto(pb.StackNode.FromString(w)) for w in wires)


def report(merged) -> str:
    return json.dumps(report_json(build_report(project(merged, lines=False, native=True))))


def timed(fn, *args):
    started = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - started


def peak_mb(fn, *args):
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--unique-tails", action="store_true",
                        help="worst case: every waiting rank's 20 innermost frames differ (4096 classes)")
    args = parser.parse_args()
    stacks = job_stacks(args.ranks, args.frames, args.unique_tails)
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{args.ranks} ranks x {args.frames} frames (+ a 3-frame watchdog thread), "
          f"{'unique tails, ' if args.unique_tails else ''}"
          f"{args.ranks // args.per_host} hosts x {args.per_host} ranks")
    hosts = args.ranks // args.per_host
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        _, t_flat = timed(flat, stacks)
        wires, t_agents = timed(agents, stacks, args.per_host)
        merged, t_console = timed(console, wires)
        document, t_report = timed(report, merged)
        for key, value in (("flat", t_flat), ("agent", t_agents / hosts), ("console", t_console),
                           ("report", t_report)):
            best[key] = min(best.get(key, value), value)
    rows = [
        ("flat: normalize + merge all raw stacks", best["flat"], peak_mb(flat, stacks)),
        (f"agent: pre-merge {args.per_host} ranks + serialize (per host)", best["agent"],
         peak_mb(agents, {r: stacks[r] for r in range(args.per_host)}, args.per_host)),
        (f"console: parse + merge {hosts} host trees", best["console"], peak_mb(console, wires)),
        ("console: classes + suspects + JSON report", best["report"], peak_mb(report, merged)),
    ]
    print(f"{'path':<52} {'best of ' + str(args.repeat):>10} {'peak alloc':>11}")
    for name, seconds, mb in rows:
        print(f"{name:<52} {seconds * 1000:>8.1f}ms {mb:>9.1f}MB")
    print(f"console total (merge + report): {(best['console'] + best['report']) * 1000:.0f} ms; "
          f"all hosts' trees on the wire: {sum(map(len, wires)) / 1e6:.2f} MB; "
          f"max RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    doc = json.loads(document)
    print(f"{len(doc['classes'])} classes (smallest first):",
          [(ranksets.fold_short(ranksets.parse(c["ranks"]), 24), c["count"]) for c in doc["classes"][:3]])
    print(f"{len(doc['suspects'])} suspects:", [s["reason"][:100] for s in doc["suspects"][:2]])


if __name__ == "__main__":
    main()
