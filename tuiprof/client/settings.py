"""The console's settings file: ``$XDG_CONFIG_HOME/tuiprof/settings.toml`` (default ``~/.config``)."""

from __future__ import annotations

import os
import pathlib
import tempfile
import tomllib

from tuiprof.model.settings import Settings, SettingsError, from_table, to_toml


def default_path() -> pathlib.Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(config) / "tuiprof" / "settings.toml"


class SettingsFile:
    """Loads the settings once and writes them whenever they change."""

    def __init__(self, path: pathlib.Path | None = None) -> None:
        self.path = path or default_path()

    def load(self) -> tuple[Settings, str | None]:
        """The saved settings, or the defaults and one line saying why the file was not used."""
        try:
            with open(self.path, "rb") as handle:
                return from_table(tomllib.load(handle)), None
        except FileNotFoundError:
            return Settings(), None
        except (OSError, tomllib.TOMLDecodeError, SettingsError) as exc:
            return Settings(), f"settings file {self.path} not used ({exc}); using the defaults"

    def save(self, settings: Settings) -> str | None:
        """Write atomically (a temporary file renamed over the old one); a line saying why on failure."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".settings.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(to_toml(settings))
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            return f"cannot save the settings to {self.path}: {exc}"
        return None
