"""`tuiprof trace --fetch/--merge` argument errors: one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from testkit.ports import free_port
from testkit.traces import run_cli


@pytest.mark.parametrize("args, message", [
    (["--merge", "--fetch", "stragglers"], "--merge fetches every file; it does not go with --fetch stragglers"),
    (["--merge", "--fetch", "none"], "--merge fetches every file; it does not go with --fetch none"),
    (["--fetch", "some"], "argument --fetch: invalid choice: 'some'"),
])
def test_fetch_and_merge_that_do_not_fit_exit_2(args, message, tmp_path):
    result = run_cli("trace", f"127.0.0.1:{free_port()}", "--duration-ms", "10", *args,
                     "--output", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
