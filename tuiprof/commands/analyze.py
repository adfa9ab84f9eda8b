"""``tuiprof analyze``: the summary (and optionally the merged timeline) of traces already on disk.

Takes files or folders of Kineto traces (``.json``/``.json.gz``, any PyTorch
2.x) and the hook's timeline dumps, groups them into ranks from each file's
``distributedInfo`` (else a ``rank<N>`` in the file name), and prints what
``tuiprof trace`` prints after a capture. ``--diff A B`` compares two captures
(each a file or a folder of rank files) instead. Exit status 0, or 2 with one
line when an input is not a trace, is cut short, or the files cannot be one
job's ranks (a file without a rank among others, a rank twice, two world sizes),
or ``--groups`` cannot be the job's layout.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tempfile
import time
from dataclasses import dataclass

from agentd.text import printable
from tuiprof.analysis.parallel_groups import KNOWN_DIMENSIONS, parse_groups
from tuiprof.analysis.trace_merge import MERGED_NAME, MergeResult, TraceHeader, TraceInput, merge_traces, trace_header
from tuiprof.analysis.trace_diff import diff, diff_json, render_diff
from tuiprof.analysis.trace_summary import STEP_MODES, RankResult, render_text, summarize, summary_json
from tuiprof.errors import BadInputError

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class AnalyzeInputError(BadInputError):
    """The arguments or files cannot be analysed (together); the message says which and what to do."""


@dataclass(frozen=True)
class _File:
    path: pathlib.Path
    rank: int | None
    header: TraceHeader


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "analyze", help="summarise (and merge) Kineto traces or timeline dumps already on disk",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("paths", nargs="*", type=pathlib.Path, metavar="PATH",
                        help="trace files (.json, .json.gz) or folders holding them")
    parser.add_argument("--diff", nargs=2, type=pathlib.Path, metavar=("A", "B"),
                        help="compare two captures of one job (each a trace file or a folder of rank files): "
                             "per-category, per-rank, per-collective and per-kernel time change from A to B")
    parser.add_argument("--output", type=pathlib.Path, metavar="FILE",
                        help=f"also write the merged timeline here (a folder: FILE/{MERGED_NAME}); "
                             "open it in ui.perfetto.dev")
    add_summary_arguments(parser)
    add_layout_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document (as `tuiprof trace --json`)")
    parser.set_defaults(func=run)


def add_summary_arguments(parser: argparse.ArgumentParser) -> None:
    """``--steps``: which part of each trace the summary counts (the merged timeline keeps everything);
    ``--like-hta``: whether it counts as HTA does."""
    parser.add_argument("--steps", choices=STEP_MODES, default="all",
                        help="what the summary counts: all = the whole trace (default); complete = only whole "
                             "ProfilerStep# windows, dropping the last step, which the profiler's stop cuts short "
                             "(HTA's default); GPU work counts by when it was launched")
    parser.add_argument("--like-hta", action="store_true",
                        help="count as HTA 0.5 does, to compare with its numbers: times rounded to whole µs, GPU work "
                             "queued before the trace left out (with two or more ProfilerSteps), communication = "
                             "kernels named nccl…Kernel only (default: every collective the profiler recorded or "
                             "a collective library's kernel)")


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """``--groups`` and ``--link-matmuls``: how the merged timeline lays the ranks out and what else it links."""
    parser.add_argument("--groups", metavar="LAYOUT",
                        help="lay the merged timeline's ranks out by parallel group, as xpu-timer's --groups: e.g. "
                             "tp4-cp2-dp4-pp2, first dimension fastest-varying (Megatron's order; dimensions "
                             f"{', '.join(KNOWN_DIMENSIONS)}; the sizes multiply to the world size). Default: the "
                             "process groups the traces list (distributedInfo.pg_config), else by rank")
    parser.add_argument("--link-matmuls", metavar="DIM",
                        help="also link the n-th matmul of each shape across the ranks of each DIM group (a "
                             "dimension of the layout, e.g. tp; needs traces recorded with shapes)")


def check_layout_arguments(args: argparse.Namespace) -> None:
    """A ``--groups`` that is not a layout is refused before anything is read or captured."""
    if args.groups is not None:
        parse_groups(args.groups)


def merged_json(merged: MergeResult) -> dict:
    """The ``merged`` part of the ``--json`` document (and ``tuiprof trace``'s)."""
    return {"path": str(merged.output), "events": merged.events, "base_time_ns": merged.base_time_ns,
            "linked_collectives": merged.linked_collectives,
            "groups": merged.layout.describe() if merged.layout is not None else None,
            "linked_matmuls": merged.linked_matmuls}


def merged_line(merged: MergeResult) -> str:
    """The merged timeline in one line of text (``tuiprof analyze`` and ``tuiprof trace``)."""
    laid_out = f"; ranks laid out by {merged.layout.describe()}" if merged.layout is not None else ""
    return f"merged trace: {merged.output} ({merged.events} events{laid_out}; open in ui.perfetto.dev)"


def trace_files(paths: list[pathlib.Path]) -> list[pathlib.Path]:
    """Every trace file named, or inside a folder named, in a stable order."""
    found: list[pathlib.Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not inside:
                raise AnalyzeInputError(f"{path}: no .json or .json.gz files in this folder")
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            raise AnalyzeInputError(f"{path}: no such file or folder")
    return list(dict.fromkeys(found))


def _identify(path: pathlib.Path) -> _File:
    header = trace_header(path)
    rank = header.rank
    if rank is None and (match := _RANK_IN_NAME.search(path.name)):
        rank = int(match.group(1))
    return _File(path, rank, header)


def check_one_job(files: list[_File]) -> None:
    """Refuse files that cannot be told to be one job's ranks: a file without a rank among others (two
    unrelated runs look just like that), two files claiming one rank, or different world sizes."""
    rankless = next((f for f in files if f.rank is None), None)
    if rankless is not None and len(files) > 1:
        raise AnalyzeInputError(f"{rankless.path} has no rank (no distributedInfo, no rank<N> in its name), so "
                                f"nothing says it belongs to the same job as the {len(files) - 1} other file(s); "
                                "analyse it alone, or name each rank's file rank<N>")
    by_rank: dict[int, pathlib.Path] = {}
    sizes: dict[int, pathlib.Path] = {}
    for f in files:
        if f.rank is not None:
            if f.rank in by_rank:
                raise AnalyzeInputError(f"mixed jobs: {by_rank[f.rank]} and {f.path} are both rank {f.rank}; "
                                        "analyse one job's files at a time")
            by_rank[f.rank] = f.path
        if f.header.world_size is not None:
            sizes.setdefault(f.header.world_size, f.path)
    if len(sizes) > 1:
        described = ", ".join(f"{path} has world size {size}" for size, path in sizes.items())
        raise AnalyzeInputError(f"mixed jobs: {described}; analyse one job's files at a time")


def _merge(files: list[_File], output: pathlib.Path | None, args: argparse.Namespace) -> MergeResult:
    inputs = [TraceInput(f.path, rank=f.rank, header=f.header) for f in files]
    if output is not None:
        if output.is_dir():
            output = output / MERGED_NAME
        return merge_traces(inputs, output, steps=args.steps, like_hta=args.like_hta, groups=args.groups,
                            link_matmuls=args.link_matmuls)
    with tempfile.TemporaryDirectory(prefix="tuiprof-analyze-") as scratch:  # the summary only
        return merge_traces(inputs, pathlib.Path(scratch) / MERGED_NAME, steps=args.steps, timeline=False,
                            like_hta=args.like_hta, groups=args.groups, link_matmuls=args.link_matmuls)


def _capture(paths: list[pathlib.Path], output: pathlib.Path | None, args: argparse.Namespace
             ) -> tuple[list[_File], MergeResult]:
    files = [_identify(path) for path in trace_files(paths)]
    check_one_job(files)
    return files, _merge(files, output, args)


def _warn_unavailable(results: list[RankResult]) -> None:
    for result in results:
        rank = result.summary
        if not rank.gpu_kernels:
            print(f"tuiprof analyze: {rank.file}: {rank.unavailable['compute_us']}: the GPU split is unavailable",
                  file=sys.stderr)


def _check_usage(args: argparse.Namespace) -> None:
    if args.diff and args.paths:
        raise AnalyzeInputError("give either PATH… or --diff A B, not both")
    if args.diff and args.output is not None:
        raise AnalyzeInputError("--output writes one capture's merged timeline; it does not go with --diff")
    if not args.diff and not args.paths:
        raise AnalyzeInputError("give trace files or folders (PATH…), or --diff A B")
    if args.diff and (args.groups is not None or args.link_matmuls is not None):
        raise AnalyzeInputError("--groups and --link-matmuls lay out one capture's merged timeline; "
                                "they do not go with --diff")
    check_layout_arguments(args)


def run(args: argparse.Namespace) -> int:
    _check_usage(args)
    if args.diff:
        return _run_diff(args)
    started = time.monotonic()
    try:
        files, merged = _capture(args.paths, args.output, args)
    except OSError as exc:
        raise AnalyzeInputError(f"cannot write --output {args.output}: {exc.strerror}") from exc
    summary = summarize(merged.ranks)
    _warn_unavailable(merged.ranks)
    kept = args.output is not None
    if args.json:
        document = {"files": [str(f.path) for f in files], "merged": merged_json(merged) if kept else None,
                    "summary": summary_json(summary),
                    "seconds": {"merge_and_summary": round(time.monotonic() - started, 3)}}
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(printable(render_text(summary), keep_lines=True))  # kernel names are the job's text
    if kept:
        sys.stdout.write(merged_line(merged) + "\n")
    return 0


def _run_diff(args: argparse.Namespace) -> int:
    sides = []
    for side in args.diff:
        files, merged = _capture([side], None, args)
        summarize(merged.ranks)  # fills each rank's compute against the job's median
        sides.append((files, merged.ranks))
    (files_a, ranks_a), (files_b, ranks_b) = sides
    result = diff(ranks_a, ranks_b)
    if args.json:
        document = {"a": [str(f.path) for f in files_a], "b": [str(f.path) for f in files_b],
                    "diff": diff_json(result)}
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(printable(render_diff(result), keep_lines=True))
    return 0
