"""``tuiprof trace``: one synchronized capture across hosts, summarised where the traces are.

Every agent gets the same start time, summarises its own ranks' files when
they are written and sends the summaries back; the command reduces them into
one summary (where the time went, collectives across ranks, stragglers) and
lists each file with its host and path: the files stay on the nodes.
``--fetch stragglers`` fetches only the ranks the straggler analysis points
at, ``--fetch all`` every file, into ``--output/<host>/``; ``--merge`` fetches
every file and writes ``--output/merged.trace.json.gz`` (open it in
ui.perfetto.dev). With no host (an embedded agent for this command) every
file is fetched. Exit status 0 when every matched rank wrote its file (and
each file asked for was fetched), 1 when some did not (or nothing matched),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass, field

import msgspec

from agentd.address import AgentAddress
from agentd.text import printable
from tuiprof.analysis.stragglers import TraceStraggler, trace_stragglers
from tuiprof.analysis.trace_merge import MergeResult, TraceFormatError, merge_capture
from tuiprof.analysis.trace_reduce import ReducedSummary, reduce_summaries, remote_ranks
from tuiprof.analysis.trace_summary import TraceSummary, render_text
from tuiprof.client.capture import (DEFAULT_START_DELAY_MS, REGISTRATION_WAIT_SECONDS, CaptureSpec, capture_cluster,
                                    fetch_files)
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.local import local_agent
from tuiprof.client.targets import add_target_arguments, addresses, connection
from tuiprof.commands.analyze import (
    add_layout_arguments, add_summary_arguments, check_layout_arguments, merged_json, merged_line,
)
from tuiprof.errors import BadInputError, TuiprofError
from tuiprof.model.capture import ClusterCapture, HostProgress
from tuiprof.model.messages import TraceTargetState


class UnmergeableCaptureError(TuiprofError):
    """A fetched file of the capture is not a trace that can be merged: the capture did not deliver
    (exit status 1, as for ranks that wrote no file; the files were not the user's input)."""


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
    parser.add_argument("--fetch", choices=FETCH_CHOICES, metavar="{none,stragglers,all}",
                        help="which files to fetch into --output: none (default: they stay on their nodes, listed "
                             "with host and path), stragglers (the ranks the straggler analysis points at, and a "
                             "typical rank to compare with) or all (the default with no host: the embedded agent's "
                             "files go when the command ends)")
    parser.add_argument("--merge", action="store_true",
                        help="fetch every file and write --output/merged.trace.json.gz (for ui.perfetto.dev)")
    add_layout_arguments(parser)
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
    add_summary_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    parser.set_defaults(func=run)


FETCH_CHOICES = ("none", "stragglers", "all")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def spec_from_args(args: argparse.Namespace) -> CaptureSpec:
    """The capture the arguments describe; BadInputError with the reason when they do not fit together."""
    for name in ("duration_ms", "iterations", "last_events"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise BadInputError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.kind == "kineto" and args.last_events is not None:
        raise BadInputError("--last-events is for --kind timeline; Kineto traces take --duration-ms or --iterations")
    if args.kind == "timeline" and args.iterations is not None:
        raise BadInputError("--kind timeline takes --duration-ms or --last-events, not --iterations")
    if args.start_delay_ms < 0 or args.timeout <= 0:
        raise BadInputError("--start-delay-ms must be 0 or more and --timeout positive")
    return CaptureSpec(kind=args.kind, duration_ms=args.duration_ms, iterations=args.iterations,
                       last_events=args.last_events, pids=args.pids, ranks=args.ranks, job_id=args.job_id,
                       record_shapes=args.record_shapes, profile_memory=args.profile_memory,
                       with_stack=args.with_stack, with_flops=args.with_flops, with_modules=args.with_modules,
                       steps=args.steps, like_hta=args.like_hta,
                       start_delay_ms=args.start_delay_ms if args.kind == "kineto" else 0, timeout_s=args.timeout)


def _host_json(host: HostProgress) -> dict:
    return {
        "host": host.host, "capture_id": host.capture_id, "error": host.error or None, "message": host.message or None,
        "targets": [{"pid": t.pid, "rank": t.rank_number, "state": t.state,
                     "file": t.file, "reason": t.reason or None,
                     "local": next((str(f.local) for f in host.files if f.remote == t.file), None)}
                    for t in host.targets],
    }


# repr=False: asyncio.run reprs its main task, result included, when it restores the SIGINT
# handler (Python 3.11's signal module); a capture of 512 ranks took 1.5 s to repr.
@dataclass(repr=False)
class TraceRun:
    """What the command did: the capture, the agents' summaries reduced, and what it fetched."""

    capture: ClusterCapture
    reduced: ReducedSummary
    stragglers: list[TraceStraggler]
    fetch: str  # none, stragglers or all
    fetch_errors: list[str] = field(default_factory=list)
    seconds: dict[str, float | None] = field(default_factory=dict)

    @property
    def delivered(self) -> bool:
        """Every matched rank wrote its file, and every file asked for is here."""
        capture = self.capture
        written = capture.matched > 0 and not any(h.error for h in capture.hosts) and all(
            t.state == TraceTargetState.WRITTEN for h in capture.hosts for t in h.targets)
        return written and not self.fetch_errors


def _describe(host: HostProgress) -> str:
    if host.error:
        return f"[red]{host.error}[/]"
    if not host.targets:
        return host.message or host.phase
    return host.states_text()


async def _trace(args: argparse.Namespace, spec: CaptureSpec, output: pathlib.Path) -> TraceRun:
    targets = addresses(args)
    options = connection(args)
    fetch = "all" if args.merge else args.fetch
    if targets:
        return await _trace_hosts(args, targets, spec, output, options, fetch or "none")
    # The embedded agent lives only for this command: it writes into a folder removed
    # when the command ends, so its files are fetched into --output before that.
    with tempfile.TemporaryDirectory(prefix="tuiprof-trace-agent-") as agent_dir:
        async with local_agent(trace_dir=pathlib.Path(agent_dir)) as address:
            return await _trace_hosts(args, [address], spec, output, options, fetch or "all")


async def _trace_hosts(args: argparse.Namespace, targets: list[AgentAddress], spec: CaptureSpec, output: pathlib.Path,
                       options: ConnectionOptions, fetch: str) -> TraceRun:
    """Capture, reduce the agents' summaries, and fetch the files ``fetch`` names."""
    started = time.monotonic()
    capture = await _capture_hosts(args, targets, spec, options)
    captured = time.monotonic()
    reduced = reduce_summaries(remote_ranks(capture))
    run = TraceRun(capture, reduced, trace_stragglers(reduced.summary), fetch)
    reduce_done = time.monotonic()
    if fetch != "none":
        chosen = {(s.host, s.file) for s in run.stragglers}
        run.fetch_errors = await fetch_files(
            targets, capture, lambda host, target: fetch == "all" or (host.host, f"{host.host}:{target.file}") in chosen,
            output, options)
    run.seconds = {"capture_and_summaries": round(captured - started, 3), "reduce": round(reduce_done - captured, 3),
                   "fetch": round(time.monotonic() - reduce_done, 3) if fetch != "none" else None, "merge": None}
    return run


def _waiting_line(host: HostProgress) -> str:
    """The one line said on stderr when ``host``'s capture waits for a process to register."""
    return (f"tuiprof trace: waiting up to {REGISTRATION_WAIT_SECONDS:g} s for a training process to register "
            f"with the agent at {host.host} (start it under `tuiprof run`)")


async def _capture_hosts(args: argparse.Namespace, targets: list[AgentAddress], spec: CaptureSpec,
                         options: ConnectionOptions) -> ClusterCapture:
    if args.json:  # one document on stdout and no progress drawn
        def say_waiting(host: HostProgress) -> None:
            if host.phase == "waiting":
                print(_waiting_line(host), file=sys.stderr, flush=True)

        return await capture_cluster(targets, spec, None, options, say_waiting)
    # Imported only to draw the progress: `--json` (scripts) starts without rich.
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        tasks: dict[str, TaskID] = {str(a): progress.add_task(str(a), total=None, status="starting") for a in targets}

        def update(host: HostProgress) -> None:
            if host.phase == "waiting":
                progress.console.print(_waiting_line(host), markup=False, highlight=False, soft_wrap=True)
            total = len(host.targets) or None
            progress.update(tasks[host.host], total=total, completed=host.finished_targets,
                            status=_describe(host))

        return await capture_cluster(targets, spec, None, options, update)


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    output = args.output or pathlib.Path(f"tuiprof-trace-{time.strftime('%Y%m%d-%H%M%S')}")
    if output.exists() and not output.is_dir():
        raise BadInputError(f"--output {output} exists and is not a directory")
    if args.merge and args.fetch not in (None, "all"):
        raise BadInputError(f"--merge fetches every file; it does not go with --fetch {args.fetch}")
    if not args.merge and (args.groups is not None or args.link_matmuls is not None):
        raise BadInputError("--groups and --link-matmuls lay out the merged timeline; give --merge too")
    check_layout_arguments(args)
    try:
        run_ = asyncio.run(_trace(args, spec, output))
    except OSError as exc:
        raise BadInputError(f"cannot use --output {args.output}: {exc.strerror}") from exc
    capture = run_.capture
    merged: MergeResult | None = None
    summary = run_.reduced.summary
    if args.merge and capture.files:
        merging = time.monotonic()
        try:
            merged, merged_summary = merge_capture(capture, output, args.steps, args.like_hta, args.groups,
                                                   args.link_matmuls)
        except TraceFormatError as exc:
            raise UnmergeableCaptureError(str(exc)) from exc
        run_.seconds["merge"] = round(time.monotonic() - merging, 3)
        if run_.reduced.missing:  # some agents sent no summary (older agents): the files' own is whole
            summary = merged_summary
    document = _document(run_, output, merged, summary)
    if args.json:
        # msgspec: json.dump with indent is pure Python (0.5 s for 512 ranks' summaries)
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(document), indent=1).decode() + "\n")
    else:
        sys.stdout.write(printable("\n".join(_text(run_, output, merged, summary)) + "\n", keep_lines=True))
    return 0 if run_.delivered else 1


def _document(run: TraceRun, output: pathlib.Path, merged: MergeResult | None, summary: TraceSummary) -> dict:
    capture, reduced = run.capture, run.reduced
    return {"start_time_unix_ms": capture.start_time_unix_ms, "output": str(output) if capture.files else None,
            "hosts": [_host_json(h) for h in capture.hosts],
            # msgspec encodes the dataclasses field by field, as summary_json's asdict gives them, without
            # copying 512 ranks' summaries first
            "summary": summary if summary.ranks else None,
            "summary_from": "agents" if summary is reduced.summary else "merged files",
            "without_summary": [{"host": r.host, "file": r.file, "rank": r.rank, "reason": why}
                                for r, why in reduced.missing],
            "stragglers": [{"rank": s.rank, "host": s.host, "file": s.file, "why": s.why} for s in run.stragglers],
            "fetch": run.fetch, "fetch_errors": run.fetch_errors,
            "merged": merged_json(merged) if merged is not None else None,
            "all_delivered": run.delivered, "seconds": run.seconds}


def _text(run: TraceRun, output: pathlib.Path, merged: MergeResult | None, summary: TraceSummary) -> list[str]:
    capture, reduced = run.capture, run.reduced
    text = []
    if capture.matched == 0 and not any(h.error for h in capture.hosts):
        text.append("no processes matched on any host:")
        text += [f"  {h.host}: {h.message}" for h in capture.hosts]
    for host in capture.hosts:
        for target in host.targets:
            if target.state != TraceTargetState.WRITTEN:
                text.append(f"{host.host} {target.label}: {target.state}: {target.reason}")
        if host.error:
            text.append(f"{host.host}: {host.error}")
    if summary.ranks:
        text.append(render_text(summary).rstrip("\n"))
    if summary is reduced.summary:
        text += [f"no summary of {r.where}: {why}" for r, why in reduced.missing]
    if run.stragglers:
        text.append("stragglers:")
        text += [f"  rank {s.rank} on {s.host}: {s.why}" for s in run.stragglers]
    elif run.fetch == "stragglers":
        text.append("no rank stands out as a straggler: nothing fetched (--fetch all fetches every file)")
    text += [f"cannot fetch {error}" for error in run.fetch_errors]
    fetched = {(f.host, f.remote): f.local for f in capture.files}
    written = [(h.host, t) for h in capture.hosts for t in h.targets if t.state == TraceTargetState.WRITTEN]
    if written:
        text.append("trace files" + (f" (fetched into {output})" if fetched else
                                     " (on their nodes: --fetch stragglers|all or --merge to fetch)") + ":")
        text += [f"  {target.label}: {host}:{target.file}" + (f" -> {fetched[(host, target.file)]}"
                                                                if (host, target.file) in fetched else "")
                 for host, target in written]
    if run.fetch == "stragglers" and fetched:
        text.append(f"analyse them: tuiprof analyze {' '.join(str(p) for p in fetched.values())}")
    if merged is not None:
        text.append(merged_line(merged))
    return text
