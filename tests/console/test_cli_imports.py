"""``tuiprof COMMAND …`` imports only that command's module, and parses exactly as the whole parser does."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from tuiprof.cli import COMMANDS, TOP_LEVEL_DEFAULTS, build_parser, command_parser

# The fewest arguments each command takes.
SAMPLES = {"connect": ["h1"], "status": [], "record": ["f.ndjson"], "replay": ["f.ndjson"], "stacks": [],
           "trace": ["--duration-ms", "5", "h1:9"], "analyze": ["x.json"], "run": ["--", "true"],
           "gemm-replay": ["--device", "cpu"], "prometheus-targets": [], "doctor": []}


@pytest.mark.parametrize("name", list(COMMANDS.values()))
def test_one_command_parses_as_the_whole_parser(name):
    argv = [name, *SAMPLES[name]]
    assert vars(command_parser(argv).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_top_level_defaults_are_the_whole_parsers():
    parser = build_parser()
    top_level = {action.dest: action.default for action in parser._actions  # --version sets nothing
                 if action.dest not in ("help", "command") and action.default != argparse.SUPPRESS}
    assert top_level == TOP_LEVEL_DEFAULTS


@pytest.mark.parametrize("argv", [["analyze", "--no-such-option", "x.json"], ["trace", "--duration-ms", "x"],
                                  ["trace"], ["nosuch"]])
def test_errors_read_as_the_whole_parsers(argv, capsys):
    with pytest.raises(SystemExit) as whole:
        build_parser().parse_args(argv)
    expected = capsys.readouterr()
    with pytest.raises(SystemExit) as one:
        command_parser(argv).parse_args(argv)
    assert (one.value.code, capsys.readouterr()) == (whole.value.code, expected)


def test_a_command_imports_no_other_command():
    code = ("import json, sys; from tuiprof.cli import command_parser; command_parser(['analyze']); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('tuiprof.commands', 'textual', "
            "'httpx', 'grpc')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert loaded == ["tuiprof.commands", "tuiprof.commands.analyze"]
