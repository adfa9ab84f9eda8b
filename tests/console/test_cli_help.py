"""``--help`` of every command reads as plain help: the module docstrings its descriptions come
from are reStructuredText, whose literal markup (````x````) is not shown."""

from __future__ import annotations

import contextlib
import io

import pytest

from tuiprof.cli import COMMANDS, command_parser


@pytest.mark.parametrize("argv", [[], *([name] for name in COMMANDS.values())], ids=lambda argv: " ".join(argv) or "tuiprof")
def test_help_has_no_rst_literals(argv: list[str]) -> None:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        command_parser([*argv, "--help"]).parse_args([*argv, "--help"])
    assert "usage: tuiprof" in shown.getvalue()
    assert "``" not in shown.getvalue()
