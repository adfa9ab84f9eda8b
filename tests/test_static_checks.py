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


def test_no_checked_in_symlink_points_at_its_own_ancestor():
    """pip's editable install walks the checkout following links (setuptools' file list): a link to
    one of its own ancestor folders (as sysfs's ``device`` links are) makes that walk endless, and CI
    never gets to the tests. Fixtures that need such links make them at test time."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    loops = [link for link in links
             if (ROOT / link).resolve() in (ROOT / link).parents or (ROOT / link).resolve() == ROOT]
    assert not loops, f"symlinks that point at their own ancestor folders: {loops}"
