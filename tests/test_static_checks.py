"""ruff, mypy and import-linter over the whole tree: a lint error, a type error or an
upward import (docs/architecture.md, "Layers") fails the suite like any other defect."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


@pytest.mark.parametrize("command", [
    ["ruff", "check", "agentd", "tuiprof", "tuiprof_native", "tests", "bench"],
    ["mypy"],
    ["lint-imports"],
], ids=lambda command: command[0])
def test_static_check_is_clean(command):
    result = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=280)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
