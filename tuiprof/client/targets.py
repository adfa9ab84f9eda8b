"""Which agents to talk to and how: the host/SLURM/connection options shared by commands."""

from __future__ import annotations

import argparse
import pathlib

from agentd.address import DEFAULT_AGENT_PORT, AgentAddress
from agentd.token import TokenFileError, read_token
from tuiprof.client.channel import ConnectionOptions
from tuiprof.errors import BadInputError


class TargetError(BadInputError):
    """A host list that cannot be used (bad address, SLURM job that cannot be resolved)."""


def add_target_arguments(parser: argparse.ArgumentParser, hosts: bool = True) -> None:
    """``HOST[:PORT] …``, ``--slurm-job``, ``--port``, ``--token-file``, ``--tls-ca``."""
    if hosts:
        parser.add_argument(
            "hosts", nargs="*", metavar="HOST[:PORT]",
            help="agents to watch (default: this host, through an embedded agent)",
        )
    parser.add_argument("--slurm-job", metavar="JOBID", help="watch every node of this SLURM job")
    add_connection_arguments(parser)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--port`` (for hosts named without one) and the credentials."""
    parser.add_argument(
        "--port", type=int, default=DEFAULT_AGENT_PORT,
        help=f"agent port for hosts given without one (default {DEFAULT_AGENT_PORT})",
    )
    add_credential_arguments(parser)


def add_credential_arguments(parser: argparse.ArgumentParser) -> None:
    """``--token-file``, ``--tls-ca`` and ``--allow-plaintext-token``: what ``connection`` reads."""
    parser.add_argument("--token-file", metavar="FILE", help="shared agent token (mode 600); default $TUIPROF_TOKEN")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA certificate to verify agents' TLS certificates")
    parser.add_argument(
        "--allow-plaintext-token", action="store_true",
        help="send the token to agents beyond loopback without TLS (anyone on the path can read it)",
    )


def addresses(args: argparse.Namespace) -> list[AgentAddress]:
    """The agents named on the command line and by ``--slurm-job``, in order, without repeats."""
    if not 0 < args.port < 65536:
        raise TargetError(f"--port {args.port}: expected 1-65535")
    names: list[str] = list(getattr(args, "hosts", None) or [])
    if args.slurm_job:
        from tuiprof.client import slurm  # needs SLURM tools only when asked for

        try:
            names.extend(slurm.hosts_for_job(args.slurm_job))
        except slurm.SlurmError as exc:
            raise TargetError(f"--slurm-job {args.slurm_job}: {exc}") from exc
    return _parse_hosts(names, args.port)


def _parse_hosts(names: list[str], port: int) -> list[AgentAddress]:
    result: list[AgentAddress] = []
    for name in names:
        try:
            address = AgentAddress.parse(name, default_port=port)
        except ValueError as exc:
            raise TargetError(f"bad host {name!r}: {exc}") from None
        if address not in result:
            result.append(address)
    return result


def connection(args: argparse.Namespace, interval_ms: int = 0, timeout: float = 5.0) -> ConnectionOptions:
    """The one set of connection options every agent of this command is reached with.

    Raises TargetError when ``--token-file`` or ``--tls-ca`` cannot be used, TokenRefusedError when
    the token must not be sent to one of the hosts named on the command line (in clear text beyond
    loopback, to a loopback port another user holds). The channels ``ConnectionOptions.open`` makes
    check again before every call, also to hosts found later (SLURM, Prometheus), and fail it with
    the reason.
    """
    if args.tls_ca is not None:
        _check_tls_ca(args.tls_ca)
    try:
        token = read_token(args.token_file)
    except TokenFileError as exc:  # the agent's error type: the console's root is not above it
        raise TargetError(str(exc)) from exc
    options = ConnectionOptions(
        token=token, tls_ca=args.tls_ca,
        allow_plaintext_token=args.allow_plaintext_token, interval_ms=interval_ms, timeout=timeout,
    )
    named = _parse_hosts(list(getattr(args, "hosts", None) or []), getattr(args, "port", DEFAULT_AGENT_PORT))
    for address in named:
        options.check_token_destination(address)
    return options


def _check_tls_ca(path: str) -> None:
    """A ``--tls-ca`` that is a readable PEM certificate (grpc would fail later, less clearly)."""
    try:
        text = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise TargetError(f"--tls-ca {path}: cannot read it: {exc.strerror}; "
                          "give the CA certificate (PEM) that signed the agents' certificates") from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise TargetError(f"--tls-ca {path}: not a PEM certificate; "
                          "give the CA certificate (PEM) that signed the agents' certificates")
