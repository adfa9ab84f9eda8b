"""An agent run by a user (their console's embedded agent, or agentd started by hand) beside another user's
rank: it shows its own user's ranks, says so in its collector status, and raises no warning about the other
user's segment (whose owner did nothing wrong: the file is 0600, theirs and root's)."""

from __future__ import annotations

import subprocess
import time

from hostile.conftest import AGENTD, CLIENT, PYTHON
from testkit.agents import stop_process
from testkit.ports import free_port

ROOT_SECRET = "root-private-5d1e"
OWN_SECRET = "user-own-77b0"


def test_a_users_agent_shows_its_own_ranks_only_and_says_so_without_warning(namespace, hostile_user, start_rank):
    roots = start_rank(None, ROOT_SECRET)
    theirs = start_rank(hostile_user, OWN_SECRET)
    port, metrics_port = free_port(), free_port()
    agent = namespace.popen([AGENTD, "--interval-ms", "200", "--host", "127.0.0.1", "--port", str(port),
                             "--metrics-port", str(metrics_port), "--trace-dir", "/tmp/tp-private-ranks"],
                            user=hostile_user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while '"status": 200' not in namespace.run([PYTHON, CLIENT, "--port", str(port), "healthz", "--metrics-port",
                                                    str(metrics_port)], user=hostile_user).stdout:
            assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read() if agent.stderr else ""
            time.sleep(0.2)
        seen = namespace.run([PYTHON, CLIENT, "--port", str(port), "--timeout", "30", "snapshot",
                              "--rank-pid", str(theirs.pid)], user=hostile_user, timeout=60)
        assert seen.returncode == 0, seen.stderr
        time.sleep(1.0)  # a few more intervals with root's segment beside theirs
        info = namespace.run([PYTHON, CLIENT, "--port", str(port), "info"], user=hostile_user, timeout=60)
    finally:
        stop_process(agent)
    log = agent.stderr.read() if agent.stderr else ""
    assert '"code": "OK"' in seen.stdout and f'"pid": {roots.pid},' not in seen.stdout, seen.stdout
    assert '"name": "ranks"' in info.stdout
    assert f"shows the ranks of uid {hostile_user.uid} only (this agent's user)" in info.stdout, info.stdout
    assert "rank segment" not in log and "WARNING" not in log, log
