"""agentd settings: one validated ``AgentConfig`` from a TOML file plus command-line flags.

The file and the flags share one table of keys (``FIELDS``), so a key means the
same thing in both places and is checked by the same code. Flags override the
file; the file (``/etc/tuiprof/agentd.toml`` when present) overrides defaults.
Paths in the file are relative to the file's own directory.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from agentd.address import DEFAULT_AGENT_PORT, DEFAULT_METRICS_PORT
from agentd.errors import ConfigError

DEFAULT_CONFIG_FILE = pathlib.Path("/etc/tuiprof/agentd.toml")
LOG_FORMATS = ("text", "json")
# Names on /metrics: ours only, or dynolog's families (bare names, host_name label) first, then ours.
METRIC_NAMINGS = ("tuiprof", "dynolog")
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 3_600_000


def default_trace_dir() -> pathlib.Path:
    """Where traces land unless configured: a system dir for root, the user's state dir otherwise."""
    if os.geteuid() == 0:
        return pathlib.Path("/var/lib/tuiprof/traces")
    state = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return pathlib.Path(state) / "tuiprof" / "traces"


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_AGENT_PORT
    # None only for the embedded agent, which serves no Prometheus endpoint.
    metrics_port: int | None = DEFAULT_METRICS_PORT
    interval_ms: int = 1000
    token_file: pathlib.Path | None = None
    # Accept a token on a non-loopback address without TLS (clients send it in clear text).
    allow_plaintext_token: bool = False
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    trace_dir: pathlib.Path = dataclasses.field(default_factory=default_trace_dir)
    log_format: str = "text"
    # "-" for stdout, a path for a file, None for no JSON-lines output.
    json_sink: str | None = None
    # Hang detection (agentd.hang): no progress this long is a hang; a shorter stall is a suspect.
    hang_timeout_s: int = 300
    hang_suspect_s: int | None = None  # None: a fifth of hang_timeout_s
    # dynolog's RPC for the `dyno` CLI (agentd.kineto.rpc); None: not served.
    dynolog_rpc_port: int | None = None
    metric_names: str = "tuiprof"
    # Directory of the Kineto IPC socket; None: $KINETO_IPC_SOCKET_DIR, else the
    # host-wide abstract name. Not a command-line key: the embedded agent of a
    # non-root console sets a private one (agentd.embedded).
    kineto_socket_dir: str | None = None

    @property
    def hang_suspect_seconds(self) -> float:
        return self.hang_suspect_s if self.hang_suspect_s is not None else self.hang_timeout_s / 5

    @property
    def interval_seconds(self) -> float:
        return self.interval_ms / 1000.0


# ------------------------------------------------------------------ value checks
# Each check takes the raw value (from TOML or from a flag's text) and returns the
# typed value, or raises ValueError whose text completes "must be ...".


def _port(value: Any) -> int:
    number = _integer(value)
    if not 1 <= number <= 65535:
        raise ValueError(f"a port number 1-65535, got {number}")
    return number


def _interval(value: Any) -> int:
    number = _integer(value)
    if not MIN_INTERVAL_MS <= number <= MAX_INTERVAL_MS:
        raise ValueError(f"{MIN_INTERVAL_MS}-{MAX_INTERVAL_MS} milliseconds, got {number}")
    return number


def _integer(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"an integer, got {_describe(value)}")


def _seconds(value: Any) -> int:
    number = _integer(value)
    if number < 1:
        raise ValueError(f"a whole number of seconds, 1 or more, got {number}")
    return number


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"true or false, got {_describe(value)}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a string, got {_describe(value)}")
    if not value.strip():
        raise ValueError("a non-empty string")
    if "\x00" in value:
        raise ValueError("a string without NUL characters")
    return value


def _path(value: Any) -> pathlib.Path:
    return pathlib.Path(_text(value))


def _log_format(value: Any) -> str:
    text = _text(value)
    if text not in LOG_FORMATS:
        raise ValueError(f"one of {', '.join(LOG_FORMATS)}, got {text!r}")
    return text


def _metric_names(value: Any) -> str:
    text = _text(value)
    if text not in METRIC_NAMINGS:
        raise ValueError(f"one of {', '.join(METRIC_NAMINGS)}, got {text!r}")
    return text


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "array", dict: "table"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}" if kind != "table" else "a table"


@dataclasses.dataclass(frozen=True)
class Field:
    key: str
    check: Callable[[Any], Any]
    is_path: bool
    help: str


FIELDS: dict[str, Field] = {
    f.key: f
    for f in (
        Field("host", _text, False, "address to listen on (a loopback one binds both 127.0.0.1 and ::1); non-loopback needs a token"),
        Field("port", _port, False, "gRPC port"),
        Field("metrics_port", _port, False, "Prometheus /metrics and /healthz port"),
        Field("interval_ms", _interval, False, "snapshot interval in milliseconds"),
        Field("token_file", _path, True, "file holding the shared token (not world-readable)"),
        Field("allow_plaintext_token", _boolean, False,
              "accept a token on a non-loopback address without TLS (it crosses the network in clear text)"),
        Field("tls_cert", _path, True, "PEM server certificate (with tls_key)"),
        Field("tls_key", _path, True, "PEM server private key (with tls_cert)"),
        Field("trace_dir", _path, True, "directory trace files are written under"),
        Field("log_format", _log_format, False, "text or json (one JSON object per line)"),
        Field("json_sink", _text, False, "write one JSON line per interval to FILE, or - for stdout"),
        Field("hang_timeout_s", _seconds, False, "seconds without progress before ranks are hung (stacks are taken)"),
        Field("hang_suspect_s", _seconds, False, "seconds without progress before ranks are suspects (default: a fifth of the timeout)"),
        Field("dynolog_rpc_port", _port, False, "also serve dynolog's RPC here (for the dyno CLI; usually 1778); off unless set"),
        Field("metric_names", _metric_names, False,
              "tuiprof, or dynolog: /metrics also serves dynolog's metric names and host_name label, "
              "for dashboards built for dynolog"),
    )
}


def check_value(key: str, value: Any, what: str) -> Any:
    """The typed value of ``key``, or a ConfigError saying ``what`` (file and key, or flag) must be."""
    try:
        return FIELDS[key].check(value)
    except ValueError as exc:
        raise ConfigError(f"{what} must be {exc}") from None


def is_switch(key: str) -> bool:
    """Whether ``key`` is a true/false setting (a flag without a value on the command line)."""
    return FIELDS[key].check is _boolean


def parse_flag(key: str, text: str | bool) -> Any:
    """The typed value of a command-line flag (flags are text; integer keys take digits; switches True)."""
    flag = f"--{key.replace('_', '-')}"
    value: Any = text
    if isinstance(text, str) and FIELDS[key].check in (_port, _interval, _seconds):
        if not text.strip().isdigit():
            raise ConfigError(f"{flag} must be an integer, got {text!r}")
        value = int(text)
    return check_value(key, value, flag)


def read_config_file(path: pathlib.Path) -> dict[str, Any]:
    """The checked settings of one TOML file (only the keys it sets)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {path}: {exc.strerror or exc}; "
            "fix the path or permissions, or pass --config FILE"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_table(table, source=str(path), base_dir=path.parent)


def parse_table(table: Mapping[str, Any], source: str, base_dir: pathlib.Path) -> dict[str, Any]:
    """Check every key of a parsed TOML table; relative paths are taken from ``base_dir``."""
    settings: dict[str, Any] = {}
    for key, value in table.items():
        if key not in FIELDS:
            raise ConfigError(
                f"{source}: unknown key {key!r}; known keys: {', '.join(FIELDS)}"
            )
        checked = check_value(key, value, f"{source}: {key}")
        if FIELDS[key].is_path:
            checked = base_dir / checked
        if key == "json_sink" and checked != "-":
            checked = str(base_dir / checked)
        settings[key] = checked
    return settings


def build_config(file_settings: Mapping[str, Any], flag_settings: Mapping[str, Any]) -> AgentConfig:
    """Defaults, then the file, then the flags; then the rules that span keys."""
    merged = {**file_settings, **flag_settings}
    config = AgentConfig(**merged)
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert and tls_key go together: give both (or neither)")
    if config.hang_suspect_s is not None and config.hang_suspect_s > config.hang_timeout_s:
        raise ConfigError(
            f"hang_suspect_s ({config.hang_suspect_s}) must not exceed hang_timeout_s "
            f"({config.hang_timeout_s}): a suspect is a shorter stall than a hang"
        )
    return config
