"""`tuiprof trace` argument errors (exit 2) and unreachable agents (exit 1), without PyTorch."""

from __future__ import annotations

import json

import pytest

from testkit.ports import free_port
from testkit.traces import run_cli


@pytest.mark.parametrize("args, message", [
    (["--kind", "timeline", "--iterations", "3"], "--kind timeline takes --duration-ms or --last-events"),
    (["--last-events", "5"], "--last-events is for --kind timeline"),
    (["--duration-ms", "0"], "--duration-ms must be a positive number"),
    (["--duration-ms", "10", "--pids", "1,x"], "expected comma-separated integers"),
    (["--duration-ms", "10", "somehost:99999"], "bad host 'somehost:99999'"),
])
def test_bad_arguments_exit_2_with_the_reason(args, message, tmp_path):
    result = run_cli("trace", *args, "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_unreachable_agent_exits_1_and_says_so(tmp_path):
    port = free_port()
    result = run_cli("trace", f"127.0.0.1:{port}", "--duration-ms", "10", "--output", str(tmp_path / "out"),
                     "--json")
    assert result.returncode == 1
    [host] = json.loads(result.stdout)["hosts"]
    assert host["host"] == f"127.0.0.1:{port}" and host["error"].startswith("cannot connect")
