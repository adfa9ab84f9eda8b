"""Headless commands against a real agent with a token, and bad input: one clear line, a documented
exit status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest

from testkit.agents import running_agent, write_token
from tuiprof.client.errors import describe_rpc_error

TOKEN = "s3cret-token-for-cli-tests"


def tuiprof(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def token_agent(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("token-agent")
    with running_agent(tmp_path, token=TOKEN) as agent:
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        yield agent, write_token(wrong, "not-the-token")


def test_record_with_a_wrong_token_exits_1_and_says_why_once(token_agent, tmp_path):
    agent, wrong = token_agent
    out = tmp_path / "run.ndjson"
    result = tuiprof("record", str(out), agent.address.target, "--token-file", str(wrong), "--duration", "2")
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"tuiprof record: {agent.address.target}: unreachable: refused: the agent does not accept "
                    "this token; check that --token-file (or $TUIPROF_TOKEN) holds the agent's token")
    assert "Traceback" not in result.stderr


def test_a_refusal_without_a_token_says_to_pass_one():
    refused = grpc.aio.AioRpcError(grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "missing or wrong token: send `authorization: Bearer <token>`")
    assert describe_rpc_error(refused, 5, token_given=False) == (
        "refused: the agent needs a token; pass --token-file FILE or set $TUIPROF_TOKEN")


def test_status_table_into_a_pipe_is_not_cut_and_says_up(token_agent, tmp_path):
    agent, _ = token_agent
    result = tuiprof("status", agent.address.target, "--token-file", str(write_token(tmp_path, TOKEN)))
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "Host" in line)
    for column in ("State", "CPU", "Util avg/min", "SM avg/min", "NCCL busbw", "Hang"):
        assert column in header
    assert "│ up " in result.stdout and "…" not in result.stdout


@pytest.mark.parametrize("content", [b"not a cert\n", None])
def test_a_tls_ca_that_cannot_be_used(tmp_path, content):
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    for command in (["status", "127.0.0.1:1"], ["stacks", "127.0.0.1:1"], ["record", str(tmp_path / "r"), "127.0.0.1:1"]):
        result = tuiprof(*command, "--tls-ca", str(ca))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and f"--tls-ca {ca}: " in result.stderr
        assert ("not a PEM certificate" if content else "No such file") in result.stderr


def test_replay_of_a_binary_file_and_into_a_pipe(tmp_path):
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    result = tuiprof("replay", str(binary))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{binary}:1: not a tuiprof recording line" in result.stderr
    good = tmp_path / "good.ndjson"
    good.write_text('{"t": 1, "host": "a", "event": "unreachable", "error": "x"}\n')
    result = tuiprof("replay", str(good), timeout=20)  # stdout is a pipe here: refused, not drawn into stderr
    assert result.returncode == 2 and "stdout is not a terminal" in result.stderr
