"""``tuiprof gemm-replay``: the GEMM shapes a rank ran, timed again alone on a device you name, beside their
speed in the job: a slow GPU (slow alone too) told from contention (fast alone).

The shapes and their in-job TFLOPS come from live agents, watched for ``--seconds`` (the hosts named, a
SLURM job's nodes, or this host through an embedded agent, as ``tuiprof status``), or from a ``tuiprof
record`` file (``--recording``). One rank is replayed: ``--rank``, ``--pid``, ``--job`` choose it, none
needed when there is one. The replay needs PyTorch (``tuiprof.commands.gemm_timing``). Exit status 0
when the shapes were replayed, 1 when no agent answered, 2 for bad input: an option, a rank that is not
there or ran no GEMM, a device PyTorch cannot use, or no PyTorch.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

from agentd.address import AgentAddress
from tuiprof.analysis.gemm_replay import (
    AloneFigure, NotReplayed, RankChoice, ReplayRow, choose_rank, job_gemms, not_replayable, parse_shape, render,
)
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import HostClient
from tuiprof.client.local import local_agent
from tuiprof.client.targets import add_target_arguments, addresses, connection
from tuiprof.commands.gemm_timing import TorchDevice
from tuiprof.errors import BadInputError, TuiprofError
from tuiprof.model import record
from tuiprof.model.events import HostEvent, HostUnreachable, SnapshotReceived


class NoAnswerError(TuiprofError):
    """No agent sent a snapshot while watched (exit 1, as ``status`` for a host that did not answer)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gemm-replay", help="time a rank's GEMM shapes alone on a device: slow GPU or contention?",
        description=__doc__.split("\n\n")[0],
    )
    add_target_arguments(parser)
    parser.add_argument("--device", required=True, metavar="DEVICE",
                        help="where to replay: a GPU as PyTorch names it (cuda:1; one the job does not use, "
                             "or the job's own once it stopped), or cpu")
    parser.add_argument("--recording", type=pathlib.Path, metavar="FILE",
                        help="take the shapes from a `tuiprof record` file instead of live agents")
    parser.add_argument("--rank", type=int, metavar="N", help="the rank to replay (RANK of the job)")
    parser.add_argument("--pid", type=int, metavar="PID", help="the rank process to replay, by its pid")
    parser.add_argument("--job", metavar="ID", help="the job of --rank, when the hosts run several")
    parser.add_argument("--seconds", type=float, default=5.0, metavar="S",
                        help="how long to watch live agents for the job's figures (default 5)")
    parser.add_argument("--warmup-seconds", type=float, default=0.2, metavar="S",
                        help="untimed calls per shape for this long before the timed ones, so that an idle GPU's "
                             "clocks are up (default 0.2)")
    parser.add_argument("--calls", type=int, default=50, metavar="N",
                        help="timed calls per shape; the median is reported (default 50)")
    parser.set_defaults(func=run)


async def _watch(targets: list[AgentAddress], options: ConnectionOptions, seconds: float) -> list[HostEvent]:
    """Every event of the agents over ``seconds`` (each host's snapshots in the order they came)."""
    events: list[HostEvent] = []
    await asyncio.gather(*(HostClient(a, options, events.append).once(lambda _: False, seconds) for a in targets))
    return events


async def _live_events(args: argparse.Namespace) -> list[HostEvent]:
    options = connection(args, timeout=args.seconds)
    targets = addresses(args)
    if targets:
        return await _watch(targets, options, args.seconds)
    async with local_agent() as address:
        return await _watch([address], options, args.seconds)


def _events(args: argparse.Namespace) -> list[HostEvent]:
    if args.recording is None:
        events = asyncio.run(_live_events(args))
        if not any(isinstance(event, SnapshotReceived) for event in events):
            down = "; ".join(f"{e.host}: {e.error}" for e in events if isinstance(e, HostUnreachable))
            raise NoAnswerError(f"no agent sent a snapshot within {args.seconds:g} s" + (f" ({down})" if down else ""))
        return events
    if args.hosts or args.slurm_job:
        raise BadInputError("--recording takes the shapes from the file: name no HOST or --slurm-job with it")
    events = list(record.read(args.recording))
    if not any(isinstance(event, SnapshotReceived) for event in events):
        raise BadInputError(f"{args.recording} holds no snapshot: record one with `tuiprof record FILE`")
    return events


def _check(args: argparse.Namespace) -> None:
    if args.seconds <= 0:
        raise BadInputError(f"--seconds {args.seconds}: expected a positive number of seconds")
    if args.calls < 1:
        raise BadInputError(f"--calls {args.calls}: expected 1 or more")
    if args.warmup_seconds < 0:
        raise BadInputError(f"--warmup-seconds {args.warmup_seconds}: expected 0 or more")


def run(args: argparse.Namespace) -> int:
    _check(args)
    device = TorchDevice(args.device)  # before watching: no PyTorch or no such GPU is said at once
    events = _events(args)
    chosen = choose_rank(events, RankChoice(args.rank, args.pid, args.job))
    gemms = job_gemms(events, chosen)
    print(f"tuiprof gemm-replay: {len(gemms)} GEMM signatures of {chosen}, replaying on {device.description}",
          file=sys.stderr)
    replayed: dict[tuple[str, str], AloneFigure | NotReplayed] = {}  # one replay per dtype and shape
    rows = []
    for gemm in gemms:
        reason = not_replayable(gemm)
        if reason is not None:
            rows.append(ReplayRow(gemm, NotReplayed(reason)))
            continue
        key = (gemm.dtype, gemm.shape)
        if key not in replayed:
            replayed[key] = device.replay(parse_shape(gemm.shape), gemm.dtype, args.warmup_seconds, args.calls)
        rows.append(ReplayRow(gemm, replayed[key]))
    print("\n".join(render(chosen, device.description, args.warmup_seconds, rows)))
    return 0
