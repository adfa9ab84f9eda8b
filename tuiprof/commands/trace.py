"""``tuiprof trace``: one synchronized capture across hosts, one merged timeline, one summary.

Every agent gets the same start time; each fetches its ranks' files into
``--output/<host>/``; the command then writes ``--output/merged.trace.json.gz``
(open it in ui.perfetto.dev) and prints where the time went. Exit status 0
when every matched rank delivered its file, 1 when some did not (or nothing
matched), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import tempfile
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentd.address import AgentAddress
from agentd.token import TokenFileError
from tuiprof.analysis.trace_merge import MergeResult, TraceFormatError, merge_capture
from tuiprof.analysis.trace_summary import STEP_MODES, render_text, summary_json
from tuiprof.client.capture import DEFAULT_START_DELAY_MS, CaptureSpec, capture_cluster
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.local import LocalAgentError, local_agent
from tuiprof.client.targets import add_target_arguments, addresses, connection
from tuiprof.model.capture import ClusterCapture, HostProgress


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trace", help="capture a synchronized trace on every rank; merge it and summarise it",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("hosts", nargs="*", metavar="HOST[:PORT]",
                        help="agents to trace (default: this host, through an embedded agent)")
    add_target_arguments(parser, hosts=False)
    span = parser.add_mutually_exclusive_group(required=True)
    span.add_argument("--duration-ms", type=int, metavar="N", help="trace N milliseconds")
    span.add_argument("--iterations", type=int, metavar="N", help="trace N training steps (optimizer.step calls)")
    span.add_argument("--last-events", type=int, metavar="N", help="timeline only: the last N events of each rank")
    parser.add_argument("--kind", choices=("kineto", "timeline"), default="kineto",
                        help="kineto: PyTorch profiler traces (default); timeline: the hook library's event ring")
    parser.add_argument("--pids", type=_int_list, default=(), metavar="PID,…",
                        help="only these processes (or their children)")
    parser.add_argument("--ranks", type=_int_list, default=(), metavar="R,…", help="only these ranks")
    parser.add_argument("--job-id", default="", metavar="ID", help="only processes of this SLURM job id")
    parser.add_argument("--output", type=pathlib.Path, metavar="DIR",
                        help="where to put fetched files and the merged trace (default ./tuiprof-trace-<time>)")
    parser.add_argument("--record-shapes", action="store_true", help="record operator input shapes")
    parser.add_argument("--with-stack", action="store_true", help="record Python stacks")
    parser.add_argument("--profile-memory", action="store_true", help="record memory allocations")
    parser.add_argument("--with-flops", action="store_true", help="estimate FLOPs of matmuls and convolutions")
    parser.add_argument("--with-modules", action="store_true", help="record nn.Module hierarchy")
    parser.add_argument("--start-delay-ms", type=int, default=DEFAULT_START_DELAY_MS, metavar="MS",
                        help=f"start this long after now on every host (default {DEFAULT_START_DELAY_MS}: "
                             "covers libkineto's 5 s poll and its warmup)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds after the start to wait for files (default 120)")
    add_steps_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    parser.set_defaults(func=run)


def add_steps_argument(parser: argparse.ArgumentParser) -> None:
    """``--steps``: which part of each trace the summary counts (the merged timeline keeps everything)."""
    parser.add_argument("--steps", choices=STEP_MODES, default="all",
                        help="what the summary counts: all = the whole trace (default); complete = only whole "
                             "ProfilerStep# windows, dropping the last step, which the profiler's stop cuts short "
                             "(HTA's default); GPU work counts by when it was launched")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def spec_from_args(args: argparse.Namespace) -> CaptureSpec:
    """The capture the arguments describe; ValueError with the reason when they do not fit together."""
    for name in ("duration_ms", "iterations", "last_events"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.kind == "kineto" and args.last_events is not None:
        raise ValueError("--last-events is for --kind timeline; Kineto traces take --duration-ms or --iterations")
    if args.kind == "timeline" and args.iterations is not None:
        raise ValueError("--kind timeline takes --duration-ms or --last-events, not --iterations")
    if args.start_delay_ms < 0 or args.timeout <= 0:
        raise ValueError("--start-delay-ms must be 0 or more and --timeout positive")
    return CaptureSpec(kind=args.kind, duration_ms=args.duration_ms, iterations=args.iterations,
                       last_events=args.last_events, pids=args.pids, ranks=args.ranks, job_id=args.job_id,
                       record_shapes=args.record_shapes, profile_memory=args.profile_memory,
                       with_stack=args.with_stack, with_flops=args.with_flops, with_modules=args.with_modules,
                       start_delay_ms=args.start_delay_ms if args.kind == "kineto" else 0, timeout_s=args.timeout)


def _host_json(host: HostProgress) -> dict:
    return {
        "host": host.host, "capture_id": host.capture_id, "error": host.error or None, "message": host.message or None,
        "targets": [{"pid": t.pid, "rank": t.rank_number, "state": t.state,
                     "file": t.file, "reason": t.reason or None,
                     "local": next((str(f.local) for f in host.files if f.remote == t.file), None)}
                    for t in host.targets],
    }


def merged_json(merged: MergeResult) -> dict:
    """The ``merged`` part of the ``--json`` document (``tuiprof analyze`` prints the same)."""
    return {"path": str(merged.output), "events": merged.events, "base_time_ns": merged.base_time_ns,
            "linked_collectives": merged.linked_collectives}


def _describe(host: HostProgress) -> str:
    if host.error:
        return f"[red]{host.error}[/]"
    if not host.targets:
        return host.message or host.phase
    return host.states_text()


async def _capture_with_progress(args: argparse.Namespace, spec: CaptureSpec, output: pathlib.Path,
                                 console: Console) -> ClusterCapture:
    targets = addresses(args)
    options = connection(args)
    if targets:
        return await _capture_hosts(args, targets, spec, output, options, console)
    # The embedded agent lives only for this command and its files are fetched into
    # --output, so it writes them into a folder removed when the command ends.
    with tempfile.TemporaryDirectory(prefix="tuiprof-trace-agent-") as agent_dir:
        async with local_agent(trace_dir=pathlib.Path(agent_dir)) as address:
            return await _capture_hosts(args, [address], spec, output, options, console)


async def _capture_hosts(args: argparse.Namespace, targets: list[AgentAddress], spec: CaptureSpec,
                         output: pathlib.Path, options: ConnectionOptions, console: Console) -> ClusterCapture:
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=console, disable=args.json) as progress:
        tasks: dict[str, TaskID] = {str(a): progress.add_task(str(a), total=None, status="starting") for a in targets}

        def update(host: HostProgress) -> None:
            total = len(host.targets) or None
            progress.update(tasks[host.host], total=total, completed=host.finished_targets,
                            status=_describe(host))

        return await capture_cluster(targets, spec, output, options, update)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        spec = spec_from_args(args)
        output = args.output or pathlib.Path(f"tuiprof-trace-{time.strftime('%Y%m%d-%H%M%S')}")
        if output.exists() and not output.is_dir():
            raise ValueError(f"--output {output} exists and is not a directory")
        started = time.monotonic()
        capture = asyncio.run(_capture_with_progress(args, spec, output, console))
        fetched = time.monotonic()
    except (ValueError, TokenFileError, LocalAgentError) as exc:  # ValueError includes TargetError
        print(f"tuiprof trace: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tuiprof trace: cannot use --output {args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    document: dict = {"start_time_unix_ms": capture.start_time_unix_ms, "output": str(output),
                      "hosts": [_host_json(h) for h in capture.hosts], "merged": None, "summary": None,
                      "all_delivered": capture.all_delivered,
                      "seconds": {"capture_and_fetch": round(fetched - started, 3), "merge_and_summary": None}}
    text = []
    if capture.matched == 0 and not any(h.error for h in capture.hosts):
        text.append("no processes matched on any host:")
        text += [f"  {h.host}: {h.message}" for h in capture.hosts]
    for host in capture.hosts:
        for target in host.targets:
            if target.state != "written":
                text.append(f"{host.host} {target.label}: {target.state}: {target.reason}")
        if host.error:
            text.append(f"{host.host}: {host.error}")
    if capture.files:
        try:
            merged, summary = merge_capture(capture, output, args.steps)
        except TraceFormatError as exc:
            print(f"tuiprof trace: {exc}", file=sys.stderr)
            return 1
        document["merged"] = merged_json(merged)
        document["summary"] = summary_json(summary)
        document["seconds"]["merge_and_summary"] = round(time.monotonic() - fetched, 3)
        text.append(render_text(summary))
        text.append(f"merged trace: {merged.output} ({merged.events} events; open in ui.perfetto.dev)")
    if args.json:
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(text) + "\n")
    return 0 if capture.all_delivered else 1
