"""TLS: an agent with a server certificate, checked by real clients (self-signed, made by openssl)."""

from __future__ import annotations

import pathlib
import shutil
import ssl
import subprocess

import grpc
import httpx
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import agentd_command, running_agent
from tuiprof.client.channel import open_channel

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
TOKEN = "tls-test-token-0123456789"


def self_signed(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A P-256 certificate for 127.0.0.1/127.0.0.2/localhost and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


async def get_info(channel: grpc.aio.Channel) -> pb.AgentInfo:
    return await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5)


async def test_tls_agent_serves_clients_that_trust_its_certificate(tmp_path):
    cert, key = self_signed(tmp_path, "agent")
    other_ca, _ = self_signed(tmp_path, "stranger")
    with running_agent(tmp_path, host="127.0.0.2", token=TOKEN, tls=(cert, key)) as agent:
        async with open_channel(agent.address, TOKEN, tls_ca=str(cert)) as channel:
            assert (await get_info(channel)).hostname
            call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=5)
            async for snapshot in call:
                assert snapshot.sequence >= 1
                break
            call.cancel()

        # Plaintext against a TLS port, and TLS that does not trust the cert: no connection.
        for tls_ca in (None, str(other_ca)):
            async with open_channel(agent.address, TOKEN, tls_ca=tls_ca) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await get_info(channel)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

        # TLS does not replace the token: a wrong one is refused.
        async with open_channel(agent.address, "not-the-token", tls_ca=str(cert)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await get_info(channel)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "tls=True" in agent.log()

        # /metrics and /healthz speak HTTPS with the same certificate.
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=5) as http:
            assert http.get(f"{agent.metrics_url}/healthz").text == "ok\n"
            assert agent.metrics_url.startswith("https://")
            assert http.get(f"{agent.metrics_url}/metrics").status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.2:{agent.metrics_port}/healthz", timeout=5)


def test_key_that_does_not_match_the_certificate_is_refused(tmp_path):
    cert, _ = self_signed(tmp_path, "one")
    _, other_key = self_signed(tmp_path, "two")
    result = subprocess.run(
        agentd_command(["--tls-cert", str(cert), "--tls-key", str(other_key),
                        "--trace-dir", str(tmp_path / "t")]),
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 3
    assert result.stderr.startswith(f"agentd: cannot use TLS certificate {cert} with key {other_key}")
    assert len(result.stderr.strip().splitlines()) == 1
