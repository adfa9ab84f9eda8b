"""One error root for the console: every error class of tuiprof is a TuiprofError, and ``tuiprof.cli.main``
turns one into a single line on stderr and its exit status."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import pkgutil

import pytest

import tuiprof
from tuiprof import cli
from tuiprof.errors import BadInputError, TuiprofError


def tuiprof_exception_classes() -> set[type[BaseException]]:
    """Every exception class defined in a module of the tuiprof package (each module imported first)."""
    for module in pkgutil.walk_packages(tuiprof.__path__, "tuiprof."):
        importlib.import_module(module.name)
    found: set[type[BaseException]] = set()
    unvisited: list[type[BaseException]] = [BaseException]
    while unvisited:
        cls = unvisited.pop()
        if cls.__module__.startswith("tuiprof."):
            found.add(cls)
        unvisited += cls.__subclasses__()
    return found


def test_every_error_class_of_tuiprof_derives_from_tuiprof_error():
    classes = tuiprof_exception_classes()
    names = {cls.__name__ for cls in classes}
    # The walk finds errors of every layer (not nothing, which would pass vacuously).
    assert {"RecordFormatError", "TargetError", "PrometheusError", "SlurmError", "TraceFormatError",
            "CaptureFormError", "AnalyzeInputError", "TokenRefusedError"} <= names
    assert [cls.__qualname__ for cls in classes if not issubclass(cls, TuiprofError)] == []


def test_bad_input_exits_2_and_the_rest_keep_their_documented_status():
    from tuiprof.client.local import LocalAgentError
    from tuiprof.commands.doctor import ChecksNotRunError
    from tuiprof.commands.run import CommandNotRunError, LaunchError
    from tuiprof.commands.trace import UnmergeableCaptureError

    assert BadInputError.exit_code == LocalAgentError.exit_code == 2
    assert LaunchError.exit_code == ChecksNotRunError.exit_code == UnmergeableCaptureError.exit_code == 1
    assert CommandNotRunError.exit_code == 127


class ExitSeven(TuiprofError):
    exit_code = 7


def test_main_prints_one_line_with_the_command_and_returns_the_exit_code(monkeypatch, capsys):
    def fail(args: argparse.Namespace) -> int:
        raise ExitSeven("the disk is full; free some space")

    monkeypatch.setattr("tuiprof.commands.doctor.run", fail)
    assert cli.main(["doctor"]) == 7
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "tuiprof doctor: the disk is full; free some space\n")


@pytest.mark.parametrize(("argv", "status", "line"), [
    (["doctor", "--agent-port", "0"], 2, "tuiprof doctor: port 0: expected 1-65535"),
    (["status", "--timeout", "0"], 2, "tuiprof status: --timeout 0.0: expected a positive number of seconds"),
    (["connect", "bad host:x"], 2, "tuiprof connect: bad host 'bad host:x': "),
    (["--interval", "-1"], 2, "tuiprof: --interval -1.0: expected a positive number of seconds"),
    (["run", "--no-kineto-daemon", "--", "/nonexistent/tuiprof-test-cmd"], 127,
     "tuiprof run: cannot run '/nonexistent/tuiprof-test-cmd': No such file or directory"),
])
def test_commands_report_bad_input_through_main(monkeypatch, capsys, argv, status, line):
    monkeypatch.delenv("NCCL_PROFILER_PLUGIN", raising=False)  # `run` would say it keeps it
    assert cli.main(argv) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err


def test_the_analyze_usage_errors_name_the_command(tmp_path: pathlib.Path, capsys):
    assert cli.main(["analyze", "--diff", str(tmp_path), str(tmp_path), str(tmp_path)]) == 2
    assert capsys.readouterr().err == "tuiprof analyze: give either PATH… or --diff A B, not both\n"
