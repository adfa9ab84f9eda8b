"""``tuiprof doctor``: what works on this host for tuiprof and what does not, why, and the line that fixes it.

Exit status 0 when everything works, 1 when something does not (each such line
says what to do), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
from dataclasses import asdict

from agentd.address import DEFAULT_AGENT_PORT, DEFAULT_METRICS_PORT
from tuiprof.client.doctor import NODE_TOKEN_FILE, Check, host_checks
from tuiprof.client.local import LocalAgentError
from tuiprof.errors import BadInputError, TuiprofError


class ChecksNotRunError(TuiprofError):
    """The checks could not run (their embedded agent did not start): something on this host does not
    work, which is exit status 1 here, not the 2 of bad arguments other commands give this failure."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check this host: GPUs, CPU counters, the agent, traces, stacks, shared memory",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--agent-port", type=int, default=DEFAULT_AGENT_PORT, metavar="PORT",
                        help=f"the node agent's gRPC port to look for (default {DEFAULT_AGENT_PORT})")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, metavar="PORT",
                        help=f"the node agent's /metrics port to look for (default {DEFAULT_METRICS_PORT})")
    parser.add_argument("--token-file", type=pathlib.Path, default=NODE_TOKEN_FILE, metavar="FILE",
                        help=f"the token file to check (default {NODE_TOKEN_FILE})")
    parser.add_argument("--json", action="store_true", help="one JSON document: a list of checks")
    parser.set_defaults(func=run)


def render(checks: list[Check]) -> str:
    width = max(len(check.area) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{'ok ' if check.ok else 'NO '} {check.area:<{width}}  {check.finding}")
        if check.fix:
            lines.append(f"    {'':<{width}}  fix: {check.fix}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    for port in (args.agent_port, args.metrics_port):
        if not 0 < port < 65536:
            raise BadInputError(f"port {port}: expected 1-65535")
    try:
        checks = asyncio.run(host_checks((args.agent_port, args.metrics_port), args.token_file))
    except LocalAgentError as exc:
        raise ChecksNotRunError(str(exc)) from exc
    if args.json:
        json.dump({"checks": [asdict(check) for check in checks]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(checks))
    return 0 if all(check.ok for check in checks) else 1
