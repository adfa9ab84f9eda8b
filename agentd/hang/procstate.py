"""A process's scheduler state from ``/proc/PID/stat``, named for humans.

Read directly (not through psutil) because the one letter is all we need and a
dump must never be attempted against a process in uninterruptible sleep.
"""

from __future__ import annotations

import pathlib

GONE = "gone"
DISK_SLEEP = "disk-sleep"

_STATES = {
    "R": "running",
    "S": "sleeping",
    "I": "idle",
    "D": DISK_SLEEP,
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
}


def process_state(pid: int, proc: pathlib.Path = pathlib.Path("/proc")) -> str:
    """``running``, ``sleeping``, ``disk-sleep``, ``stopped``, ``zombie``, ... or ``gone``."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return GONE
    # The command name may contain spaces and parentheses: the state follows the last ')'.
    letter = text[text.rindex(")") + 2]
    return _STATES.get(letter, f"unknown ({letter})")

