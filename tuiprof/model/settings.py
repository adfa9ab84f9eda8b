"""The console's settings that stay between runs: theme, host sort, filter, refresh interval,
hidden table columns and the history plots' window.

Pure: parsing a decoded TOML table and writing TOML text; the file itself is
read and written by ``tuiprof.client.settings``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from tuiprof.errors import BadInputError


class SettingsError(BadInputError):
    """The settings file holds something other than the settings (the message says which key)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    theme: str = "textual-dark"
    sort: str = "host"
    """Key of the cluster view's sort column."""
    reverse: bool = False
    filter: str = ""
    """The cluster view's host filter, as typed."""
    interval_seconds: float = 0.0
    """Seconds between snapshots asked of the agents; 0: each agent's own interval."""
    hidden_columns: tuple[str, ...] = ()
    """Columns the user hid, as ``table.column`` keys (e.g. ``cluster.power``, ``gpus.Mem clk``)."""
    history_window: str = "5 min"
    """The history plots' time window (one of ``tuiprof.tui.plots.WINDOW_NAMES``; the console checks)."""


_TYPES: dict[str, tuple[type, ...]] = {
    "theme": (str,), "sort": (str,), "reverse": (bool,), "filter": (str,), "interval_seconds": (int, float),
    "hidden_columns": (list,), "history_window": (str,),
}


def from_table(table: Mapping[str, Any]) -> Settings:
    """Settings from a decoded TOML table; keys it lacks keep their defaults."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        kinds = _TYPES.get(key)
        if kinds is None:
            raise SettingsError(f"unknown key '{key}' (known: {', '.join(_TYPES)})")
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise SettingsError(f"'{key}' = {value!r}: expected a {kinds[0].__name__}")
        values[key] = value
    hidden = values.get("hidden_columns", [])
    if not all(isinstance(name, str) for name in hidden):
        raise SettingsError(f"'hidden_columns' = {hidden!r}: expected a list of strings")
    values["hidden_columns"] = tuple(hidden)
    interval = values.get("interval_seconds", 0.0)
    if not (math.isfinite(interval) and interval >= 0):
        raise SettingsError(f"'interval_seconds' = {interval}: expected 0 or more seconds")
    return Settings(**values)


def to_toml(settings: Settings) -> str:
    """TOML text of ``settings`` (a JSON string literal is a valid TOML basic string)."""
    lines = ["# tuiprof console settings, written by the console when they change"]
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        # JSON strings, numbers and arrays of strings are valid TOML too
        text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(
            list(value) if isinstance(value, tuple) else value, ensure_ascii=False)
        lines.append(f"{field.name} = {text}")
    return "\n".join(lines) + "\n"
