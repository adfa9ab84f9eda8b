"""The installed tuiprof version, as the agent reports it in GetInfo and both command lines print it."""

from __future__ import annotations

from importlib import metadata


def installed_version() -> str:
    try:
        return metadata.version("tuiprof")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"
