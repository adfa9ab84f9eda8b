"""`tuiprof status` against real agentd processes on two loopback addresses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from testkit.agents import running_agent, stop_process, write_token

pytestmark = pytest.mark.slow


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"} | (env or {})
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", "status", *args],
                          capture_output=True, text=True, timeout=60, env=environment)


def test_json_returns_both_hosts_and_exit_1_when_one_dies(tmp_path) -> None:
    with running_agent(tmp_path, host="127.0.0.1") as one, running_agent(tmp_path, host="127.0.0.2") as two:
        result = status(one.address.target, two.address.target, "--json")
        assert result.returncode == 0, result.stderr
        hosts = json.loads(result.stdout)["hosts"]
        assert [h["host"] for h in hosts] == [one.address.target, two.address.target]
        for host in hosts:
            assert host["reachable"] is True and host["error"] is None
            assert 0.0 <= host["summary"]["cpu_percent"] <= 100.0  # a rate: needs the 2nd sample
            assert host["memory"]["total_bytes"] > 0
            assert host["cpu"]["idle_percent"] is not None
            assert isinstance(host["nics"], list) and isinstance(host["disks"], list)
            gpu = next(c for c in host["collectors"] if c["name"] == "gpu")
            if not gpu["available"]:  # no GPU here: said so, never zeros
                assert host["gpus"] == [] and host["summary"]["gpu_count"] is None
                assert host["summary"]["unavailable"]["gpu_count"] == gpu["reason"]
        stop_process(two.process)
        result = status(one.address.target, two.address.target, "--json", "--timeout", "3")
        assert result.returncode == 1
        up, down = json.loads(result.stdout)["hosts"]
        assert up["reachable"] is True
        assert down["reachable"] is False and down["error"].startswith("cannot connect")
        assert down["cpu"] is None


def test_two_agents_on_one_machine_are_told_apart_by_address(tmp_path) -> None:
    hostname = socket.gethostname()
    with running_agent(tmp_path, host="127.0.0.1") as one, running_agent(tmp_path, host="127.0.0.2") as two:
        result = status(one.address.target, two.address.target)
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if "│ up " in line]
        labels = [row.split("│")[1].strip() for row in rows]
        assert labels == [f"{hostname}@{one.address.target}", f"{hostname}@{two.address.target}"]
        # One agent alone keeps the plain hostname.
        alone = status(one.address.target)
        assert [row.split("│")[1].strip() for row in alone.stdout.splitlines() if "│ up " in row] == [hostname]


def test_table_and_token(tmp_path) -> None:
    with running_agent(tmp_path, host="127.0.0.2", token="s3cret-token") as agent:
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        refused = status(agent.address.target, "--token-file", str(write_token(wrong, "not-the-token")))
        assert refused.returncode == 1
        assert "DOWN" in refused.stdout and "the agent does not accept this token" in refused.stdout
        # without a token a caller on this host is answered as the local user the kernel names
        assert status(agent.address.target).returncode == 0
        token_file = write_token(tmp_path, "s3cret-token")
        table = status(agent.address.target, "--token-file", str(token_file))
        assert table.returncode == 0, table.stdout + table.stderr
        assert "tuiprof status" in table.stdout
        assert "│ up " in table.stdout


@pytest.fixture
def silent_host():
    """A TCP port on 127.0.0.3 that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.3:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_silent_host_costs_its_timeout_and_does_not_hold_up_the_others(tmp_path, silent_host) -> None:
    with running_agent(tmp_path, host="127.0.0.1") as agent:
        start = time.monotonic()
        result = status(silent_host, agent.address.target, "--json", "--timeout", "3")
        elapsed = time.monotonic() - start
    assert result.returncode == 1
    silent, answered = json.loads(result.stdout)["hosts"]
    assert answered["reachable"] is True and answered["summary"]["cpu_percent"] is not None
    assert silent["reachable"] is False and silent["error"] == "no answer within 3 s"
    assert elapsed < 3 + 6  # one timeout (plus interpreter start-up), not one per host


def test_bad_input_is_one_clear_line(tmp_path) -> None:
    loose = tmp_path / "token"
    loose.write_text("x")
    loose.chmod(0o644)
    result = status("127.0.0.1", "--token-file", str(loose))
    assert result.returncode == 2 and "readable by every user" in result.stderr
    result = status("127.0.0.1:99999")
    assert result.returncode == 2 and "bad host '127.0.0.1:99999'" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_host_means_this_host_through_an_embedded_agent() -> None:
    result = status("--json", "--timeout", "10")
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    # Named by this host's name: the embedded agent's ephemeral port is gone once the command ends.
    assert host["reachable"] is True and host["host"] == host["hostname"] == socket.gethostname()
    assert host["cpu"]["idle_percent"] is not None  # waited for the second sample's rates
