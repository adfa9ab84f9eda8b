"""A token is not sent in clear text beyond loopback: every command that names agents refuses, exit 2, one line.

The commands run in a fresh network namespace with no route anywhere (``unshare -n``),
so a command that wrongly went ahead could not reach any real host either; the
hostile suite (tests/hostile/test_loopback_token.py) shows a listener on such an
address receiving the token once ``--allow-plaintext-token`` is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testkit.agents import write_token
from tuiprof.client.channel import token_destination_problem
from agentd.address import AgentAddress

NOT_LOOPBACK = "192.0.2.7:1779"  # TEST-NET-1: documentation only, and unroutable in the namespace anyway

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a private network namespace")

COMMANDS = {
    "status": ["status", NOT_LOOPBACK],
    "stacks": ["stacks", NOT_LOOPBACK],
    "trace": ["trace", NOT_LOOPBACK, "--duration-ms", "100"],
    "record": ["record", "{tmp}/run.ndjson", NOT_LOOPBACK, "--duration", "1"],
    "connect": ["connect", NOT_LOOPBACK],
}


def tuiprof(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    return subprocess.run(["unshare", "-n", sys.executable, "-m", "tuiprof.cli", *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_token_in_clear_beyond_loopback_is_refused(command, tmp_path):
    token = write_token(tmp_path, "s3cret")
    args = [arg.format(tmp=tmp_path) for arg in COMMANDS[command]]
    done = tuiprof(*args, "--token-file", str(token))
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not sending the token to 192.0.2.7:1779 in clear text" in lines[0], done.stderr
    assert "--tls-ca" in lines[0] and "--allow-plaintext-token" in lines[0], lines


def test_allowed_plaintext_token_goes_on_to_connect(tmp_path):
    token = write_token(tmp_path, "s3cret")
    done = tuiprof("status", "--timeout", "1", NOT_LOOPBACK, "--token-file", str(token), "--allow-plaintext-token")
    assert "not sending the token" not in done.stderr, done.stderr
    assert done.returncode == 1, done  # unreachable in the namespace: the host's row says so


def test_where_a_token_may_go():
    remote = AgentAddress("192.0.2.7")
    assert "in clear text" in (token_destination_problem(remote, tls=False, allow_plaintext_token=False) or "")
    assert token_destination_problem(remote, tls=True, allow_plaintext_token=False) is None
    assert token_destination_problem(remote, tls=False, allow_plaintext_token=True) is None
    unresolved = token_destination_problem(AgentAddress("no-such-host.invalid"), tls=True, allow_plaintext_token=True)
    assert unresolved is not None and "cannot resolve 'no-such-host.invalid'" in unresolved
