"""The environment a tmux server for a test starts with: the pane sizes itself from tmux, never from the caller.

pytest loads readline, which exports ``COLUMNS``/``LINES`` of the terminal the tests
run in; a pane inheriting them would draw for that terminal, not for the size the
test gave tmux."""

from __future__ import annotations

import os

INHERITED_SIZE = ("COLUMNS", "LINES")


def tmux_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the terminal size it inherited, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key not in INHERITED_SIZE}
    env.update(extra)
    return env
