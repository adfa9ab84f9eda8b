"""``agentd``: the command line of the node agent.

Every mistake on the command line or in the config file ends the process with
one line on stderr, ``agentd: <what is wrong and what to do>``, and a non-zero
exit status (2 usage/config, 3 security/TLS, 4 a port that cannot be bound).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal
import sys
from typing import Any, NoReturn

from agentd.config import (
    DEFAULT_CONFIG_FILE, FIELDS, LOG_FORMATS, MAX_INTERVAL_MS, METRIC_NAMINGS, MIN_INTERVAL_MS,
    AgentConfig, build_config, is_switch, parse_flag, read_config_file,
)
from agentd.daemon import Daemon
from agentd.errors import AgentdError, UsageError
from agentd.logs import configure_logging
from agentd.version import installed_version

log = logging.getLogger("agentd")

DESCRIPTION = """\
tuiprof's node agent. Samples host, GPU and CPU-PMU metrics and serves them:
gRPC for the tuiprof console (default port 1779), Prometheus /metrics and
/healthz (default port 9779), and optionally one JSON line per interval.
"""

EPILOG = f"""\
config file:
  TOML with the same keys as the long options, dashes as underscores, e.g.
      host = "0.0.0.0"
      port = 1779
      metrics_port = 9779
      interval_ms = 1000
      token_file = "token"          # relative paths: from the file's directory
      tls_cert = "agentd.crt"
      tls_key = "agentd.key"
      trace_dir = "/var/lib/tuiprof/traces"
      log_format = "json"
      json_sink = "/var/log/tuiprof/metrics.jsonl"
  Read from --config FILE, else from {DEFAULT_CONFIG_FILE} when it exists.
  Options given on the command line override the file.

security:
  Without a token agentd listens on loopback addresses only, and each local
  caller is known by the uid the kernel reports for its socket: everyone sees
  metrics, only a rank's owner (or root) its stacks, traces and exception text.
  With a token (--token-file, mode 600, or $TUIPROF_TOKEN) it may listen on any
  address and every gRPC call must send `authorization: Bearer <token>`; beyond
  loopback it also needs TLS (--tls-cert/--tls-key) unless
  --allow-plaintext-token is given. /metrics and /healthz are read-only and need
  no token; with --tls-cert they are served over HTTPS with the same certificate.

exit status:
  0 stopped by SIGTERM/SIGINT, 2 bad command line or config, 3 token/TLS
  problem, 4 port cannot be bound, 1 anything else.
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as one UsageError line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see agentd --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="agentd", description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"agentd {installed_version()}")
    parser.add_argument("--config", metavar="FILE", type=pathlib.Path,
                        help=f"TOML config file (default: {DEFAULT_CONFIG_FILE} when present)")
    defaults = AgentConfig()
    metavars = {"host": "ADDR", "port": "PORT", "metrics_port": "PORT", "interval_ms": "MS",
                "token_file": "FILE", "tls_cert": "FILE", "tls_key": "FILE",
                "trace_dir": "DIR", "log_format": "{" + ",".join(LOG_FORMATS) + "}",
                "json_sink": "-|FILE", "hang_timeout_s": "S", "hang_suspect_s": "S",
                "dynolog_rpc_port": "PORT", "metric_names": "{" + ",".join(METRIC_NAMINGS) + "}"}
    for key, field in FIELDS.items():
        if is_switch(key):
            parser.add_argument(f"--{key.replace('_', '-')}", dest=key, action="store_const", const=True,
                                help=field.help)
            continue
        default = getattr(defaults, key)
        shown = {
            "trace_dir": "/var/lib/tuiprof/traces as root, else $XDG_STATE_HOME/tuiprof/traces",
            "interval_ms": f"{default}; {MIN_INTERVAL_MS}-{MAX_INTERVAL_MS}",
        }.get(key, default)
        suffix = f" (default: {shown})" if shown is not None else ""
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, metavar=metavars[key],
                            help=field.help + suffix)
    return parser


def load_config(argv: list[str]) -> AgentConfig:
    """The effective configuration: defaults < config file < flags."""
    args = build_parser().parse_args(argv)
    config_file = args.config
    if config_file is None and DEFAULT_CONFIG_FILE.exists():
        config_file = DEFAULT_CONFIG_FILE
    file_settings = read_config_file(config_file) if config_file is not None else {}
    flag_settings: dict[str, Any] = {
        key: parse_flag(key, getattr(args, key))
        for key in FIELDS if getattr(args, key) is not None
    }
    return build_config(file_settings, flag_settings)


async def _serve(config: AgentConfig) -> None:
    daemon = Daemon(config)
    await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await daemon.serve_until(stop)
    log.info("agentd stopped")


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv)
        configure_logging(config.log_format)
        asyncio.run(_serve(config))
    except AgentdError as exc:
        print(f"agentd: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
