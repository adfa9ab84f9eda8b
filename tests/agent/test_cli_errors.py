"""Bad input to a real ``agentd`` process: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from testkit.agents import agentd_command, write_token
from testkit.ports import free_port


def run_agentd(args, tmp_path, env=None, timeout=30):
    """Run agentd expecting it to refuse to start; returns (exit status, stderr)."""
    base = ["--trace-dir", str(tmp_path / "traces"),
            "--port", str(free_port()), "--metrics-port", str(free_port())]
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    result = subprocess.run(agentd_command(base + list(args)), capture_output=True, text=True,
                            timeout=timeout, env=env, cwd=tmp_path)
    return result.returncode, result.stderr


def assert_one_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("agentd: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_help_documents_every_option_and_the_config_file():
    result = subprocess.run(agentd_command(["--help"]), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for option in ("--config", "--host", "--port", "--metrics-port", "--interval-ms", "--token-file",
                   "--tls-cert", "--tls-key", "--trace-dir", "--log-format", "--json-sink", "--metric-names",
                   "/etc/tuiprof/agentd.toml", "TUIPROF_TOKEN", "exit status"):
        assert option in result.stdout


@pytest.mark.parametrize("args, code, fragments", [
    (["--no-such-flag"], 2, ["unrecognized arguments: --no-such-flag", "agentd --help"]),
    (["--port", "http"], 2, ["--port must be an integer, got 'http'"]),
    (["--interval-ms", "0"], 2, ["--interval-ms must be 100-3600000 milliseconds"]),
    (["--host", "0.0.0.0"], 3, ["refusing to listen on 0.0.0.0 without a token", "--token-file"]),
    (["--tls-key", "k.pem"], 2, ["tls_cert and tls_key go together"]),
    (["--metric-names", "otel"], 2, ["--metric-names must be one of tuiprof, dynolog, got 'otel'"]),
])
def test_bad_flags(tmp_path, args, code, fragments):
    status, stderr = run_agentd(args, tmp_path)
    assert status == code
    assert_one_line(stderr, *fragments)


def test_unreadable_and_malformed_config_files(tmp_path):
    status, stderr = run_agentd(["--config", str(tmp_path / "absent.toml")], tmp_path)
    assert status == 2
    assert_one_line(stderr, "cannot read config file", "absent.toml", "No such file")

    bad = tmp_path / "bad.toml"
    bad.write_text('interval_ms = "fast"\n')
    status, stderr = run_agentd(["--config", str(bad)], tmp_path)
    assert status == 2
    assert_one_line(stderr, f"{bad}: interval_ms must be an integer, got string 'fast'")

    bad.write_text("[server\n")
    status, stderr = run_agentd(["--config", str(bad)], tmp_path)
    assert status == 2
    assert_one_line(stderr, f"config file {bad} is not valid TOML")


def test_grpc_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        status, stderr = run_agentd(["--port", str(port)], tmp_path)
    assert status == 4
    assert_one_line(stderr, f"gRPC port {port} on 127.0.0.1 is already in use", "--port")


def test_metrics_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        status, stderr = run_agentd(["--metrics-port", str(port)], tmp_path)
    assert status == 4
    assert_one_line(stderr, f"metrics port {port} on 127.0.0.1 is already in use", "--metrics-port")


def test_one_port_for_grpc_and_metrics(tmp_path):
    port = free_port()
    status, stderr = run_agentd(["--port", str(port), "--metrics-port", str(port)], tmp_path)
    assert status == 2
    assert_one_line(stderr, f"--port and --metrics-port are both {port}", "two different ports")


LONG_TOKEN = "0123456789abcdef0123"


def test_address_not_on_this_machine(tmp_path):
    status, stderr = run_agentd(["--host", "192.0.2.1", "--allow-plaintext-token", "--token-file",
                                 str(write_token(tmp_path, LONG_TOKEN))], tmp_path)
    assert status == 4
    assert_one_line(stderr, "cannot listen on 192.0.2.1")


def test_a_token_beyond_loopback_needs_tls_or_the_plaintext_switch(tmp_path):
    token_file = str(write_token(tmp_path, LONG_TOKEN))
    status, stderr = run_agentd(["--host", "0.0.0.0", "--token-file", token_file], tmp_path)
    assert status == 3
    assert_one_line(stderr, "refusing to listen on 0.0.0.0 with a token but without TLS",
                    "--tls-cert", "--allow-plaintext-token")
    config = tmp_path / "agentd.toml"
    config.write_text('allow_plaintext_token = "yes"\n')
    status, stderr = run_agentd(["--config", str(config)], tmp_path)
    assert status == 2
    assert_one_line(stderr, "allow_plaintext_token must be true or false, got string 'yes'")


def test_token_file_problems(tmp_path):
    readable = write_token(tmp_path, "s3cret")
    readable.chmod(0o644)
    status, stderr = run_agentd(["--token-file", str(readable)], tmp_path)
    assert status == 3
    assert_one_line(stderr, "readable by every user", f"chmod 600 {readable}")

    status, stderr = run_agentd(["--token-file", str(tmp_path / "absent")], tmp_path)
    assert status == 3
    assert_one_line(stderr, "cannot read token file", "No such file")

    empty = write_token(tmp_path, "")
    status, stderr = run_agentd(["--token-file", str(empty)], tmp_path)
    assert status == 3
    assert_one_line(stderr, f"token file {empty} is empty")

    spaced = write_token(tmp_path, "two words")
    status, stderr = run_agentd(["--token-file", str(spaced)], tmp_path)
    assert status == 3
    assert_one_line(stderr, "spaces or non-ASCII characters")


def test_bad_tls_files(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    status, stderr = run_agentd(["--tls-cert", str(cert), "--tls-key", str(key)], tmp_path)
    assert status == 3
    assert_one_line(stderr, f"cannot use TLS certificate {cert} with key {key}", "PEM")


def test_trace_dir_and_sink_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    status, stderr = run_agentd(["--trace-dir", str(blocker / "traces")], tmp_path)
    assert status == 2
    assert_one_line(stderr, "cannot create trace directory", "--trace-dir")

    status, stderr = run_agentd(["--json-sink", str(blocker / "out.jsonl")], tmp_path)
    assert status == 2
    assert_one_line(stderr, "cannot open --json-sink file", "Not a directory")
