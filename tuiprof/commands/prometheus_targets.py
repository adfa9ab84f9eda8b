"""``tuiprof prometheus-targets [--slurm-job ID | HOST…]``: a Prometheus ``file_sd`` target file.

One target group: every node's agent metrics endpoint (``HOST:9779``, or the port
given), with the ``--label``s given. The labels are the same for every node and
name nothing of a job or a rank: a node runs many jobs in its life, and a label
that changed with them would start new series each time (the agents' own series
say which ranks run there). Point a ``file_sd_configs`` entry at the file (the
README's Prometheus section); Prometheus rereads it when it changes, and the file
is replaced atomically, so it never reads half of one.

Exit status 0 when written, 2 for bad input (a bad host or label, a SLURM job that
cannot be resolved, a file that cannot be written).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile

from agentd.address import DEFAULT_METRICS_PORT, AgentAddress
from tuiprof.client import slurm
from tuiprof.errors import BadInputError

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RESERVED_LABELS = {
    "job": "Prometheus sets it to the scrape job's name",
    "instance": "Prometheus sets it to the target's address",
    "hostname": "the agents' series carry it; a target label of that name renames theirs to exported_hostname",
}


class TargetFileError(BadInputError):
    """Input the target file cannot be made from; the message says what to do."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prometheus-targets", help="write a Prometheus file_sd target file of the agents",
        description="Write a Prometheus file_sd target file listing every node's agent metrics "
                    "endpoint, so Prometheus scrapes a SLURM job's nodes without hand edits. "
                    "Exit 0 when written, 2 for bad input.",
    )
    parser.add_argument("hosts", nargs="*", metavar="HOST[:PORT]", help="nodes whose agents to scrape")
    parser.add_argument("--slurm-job", metavar="JOBID", help="also every node of this SLURM job")
    parser.add_argument(
        "--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
        help=f"agent metrics port for hosts given without one (default {DEFAULT_METRICS_PORT})",
    )
    parser.add_argument(
        "--label", action="append", default=[], metavar="NAME=VALUE",
        help="a label for every target, e.g. cluster=a (repeatable; not job, instance or hostname)",
    )
    parser.add_argument("--output", "-o", metavar="FILE", help="write here (atomically) instead of stdout")
    parser.set_defaults(func=run)


def parse_labels(texts: list[str]) -> dict[str, str]:
    labels = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise TargetFileError(f"--label {text!r}: expected NAME=VALUE with NAME a Prometheus label "
                                  "name (letters, digits, _; not starting with __)")
        if name in RESERVED_LABELS:
            raise TargetFileError(f"--label {text!r}: {name} is not free: {RESERVED_LABELS[name]}")
        labels[name] = value
    return labels


def targets(names: list[str], metrics_port: int) -> list[str]:
    """``host:port`` of each name, in order, without repeats."""
    if not 0 < metrics_port < 65536:
        raise TargetFileError(f"--metrics-port {metrics_port}: expected 1-65535")
    result: list[str] = []
    for name in names:
        try:
            target = AgentAddress.parse(name, default_port=metrics_port).target
        except ValueError as exc:
            raise TargetFileError(f"bad host {name!r}: {exc}") from None
        if target not in result:
            result.append(target)
    return result


def target_document(hosts: list[str], labels: dict[str, str]) -> list[dict[str, object]]:
    """The file_sd document: one group of every target, with the labels."""
    return [{"targets": hosts, "labels": labels}]


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` at once: Prometheus rereads the file whenever it changes."""
    fd, temporary = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # Prometheus often runs as its own user
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    names = list(args.hosts)
    if args.slurm_job:
        try:
            names.extend(slurm.hosts_for_job(args.slurm_job))
        except slurm.SlurmError as exc:
            raise TargetFileError(f"--slurm-job {args.slurm_job}: {exc}") from exc
    if not names:
        raise TargetFileError("no hosts: name them (HOST …) or give --slurm-job JOBID")
    document = target_document(targets(names, args.metrics_port), parse_labels(args.label))
    text = json.dumps(document, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write_atomically(pathlib.Path(args.output), text)
    except OSError as exc:
        raise TargetFileError(f"cannot write {args.output}: {exc.strerror}; "
                              "give a file in a folder you can write") from exc
    return 0
