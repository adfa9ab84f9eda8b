"""The shared token: loopback rule, bearer check on every RPC, handlers never reached without it."""

from __future__ import annotations

import logging
import os
import socket

import grpc
import pytest

from agentd.auth import BearerTokenInterceptor, Caller, CallerIdentifier, is_loopback, load_token
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import running_agent, write_token
from tuiprof.client.channel import open_channel

TOKEN = "4f1c0ffee-0123456789abcdef"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.0.2.7", False), ("no-such-host.invalid", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


async def call_info(agent, token):
    async with open_channel(agent.address, token) as channel:
        return await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=10)


async def first_snapshot(agent, token):
    async with open_channel(agent.address, token) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=10)
        async for snapshot in call:
            call.cancel()
            return snapshot
    raise AssertionError("the Watch stream ended before its first snapshot")


async def test_token_agent_on_every_address_refuses_wrong_tokens(tmp_path):
    with running_agent(tmp_path, host="0.0.0.0", token=TOKEN, extra_args=["--allow-plaintext-token"]) as agent:
        assert (await call_info(agent, TOKEN)).hostname
        assert (await first_snapshot(agent, TOKEN)).sequence >= 1
        for wrong in ("wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
            for call in (call_info, first_snapshot):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call(agent, wrong)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "missing or wrong token" in caught.value.details()
        assert "refused call without a valid token" in agent.log()
        # Without a token this test is a local user (root): the kernel names its socket's owner.
        assert (await call_info(agent, None)).hostname


async def test_token_from_the_environment(tmp_path):
    env = {**os.environ, "TUIPROF_TOKEN": TOKEN}
    with running_agent(tmp_path, host="127.0.0.2", env=env) as agent:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call_info(agent, "not-the-token")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await call_info(agent, TOKEN)).hostname


class PeerContext:
    """The two things CallerIdentifier reads of a call: its peer and its metadata."""

    def __init__(self, peer, metadata=()):
        self._peer, self._metadata = peer, metadata

    def peer(self):
        return self._peer

    def invocation_metadata(self):
        return self._metadata

    async def abort(self, code, details):
        raise grpc.aio.AbortError(f"{code.name}: {details}")


async def test_a_call_without_token_from_another_host_is_refused():
    """192.0.2.7:40000 is no socket of this host (TEST-NET-1): the kernel knows no local owner."""
    remote = PeerContext("ipv4:192.0.2.7:40000")
    with pytest.raises(grpc.aio.AbortError, match="UNAUTHENTICATED: missing or wrong token"):
        await CallerIdentifier(token_required=True, port=1779).identify(remote)
    # A loopback-only agent cannot get such a call; if the lookup fails it serves nothing private.
    caller = await CallerIdentifier(token_required=False, port=1779).identify(remote)
    assert not caller.admin and caller.uid is None and "192.0.2.7:40000" in caller.reason
    holder = PeerContext("ipv4:192.0.2.7:40000", (("authorization", f"Bearer {TOKEN}"),))
    assert (await CallerIdentifier(token_required=True, port=1779).identify(holder)).admin


async def test_a_local_caller_is_known_by_its_uid(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            host, client_port = client.getsockname()
            local = PeerContext(f"ipv4:{host}:{client_port}")
            caller = await CallerIdentifier(token_required=True, port=port).identify(local)
    assert caller.uid == os.getuid() and caller.admin == (os.getuid() == 0)
    assert Caller.local(1000).owns(1000) and not Caller.local(1000).owns(1001)
    assert not Caller.local(1000).owns(None) and Caller.token_holder().owns(None)


class SpyServicer(pb_grpc.AgentServicer):
    """Counts the calls that reach a handler."""

    def __init__(self) -> None:
        self.calls = 0

    async def GetInfo(self, request, context):
        self.calls += 1
        return pb.AgentInfo(hostname="spy")

    async def Watch(self, request, context):
        self.calls += 1
        yield pb.HostSnapshot(sequence=1)


@pytest.fixture
async def spy_server():
    spy = SpyServicer()
    server = grpc.aio.server(interceptors=[BearerTokenInterceptor(TOKEN)])
    pb_grpc.add_AgentServicer_to_server(spy, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield spy, f"127.0.0.1:{port}"
    await server.stop(None)


async def test_refused_calls_never_reach_the_handler(spy_server):
    spy, target = spy_server
    cases = [
        (("authorization", "wrong"),),
        (("authorization", f"Basic {TOKEN}"),),
        (("authorization", f"bearer {TOKEN}"),),                 # the scheme is exact
        (("authorization", f"Bearer {TOKEN} "),),
        (("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")),  # ambiguous
        (("authorization", ""),),
    ]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.AgentStub(channel)
        raw_info = channel.unary_unary("/tuiprof.v1.Agent/GetInfo")
        for metadata in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetInfo(pb.GetInfoRequest(), metadata=metadata, timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.Watch(pb.WatchRequest(), metadata=metadata, timeout=5):
                    pass
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Not even parsed: garbage bytes get UNAUTHENTICATED, not a parse error.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw_info(b"\xff\xff\xff", metadata=metadata, timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert spy.calls == 0
        reply = await stub.GetInfo(pb.GetInfoRequest(),
                                   metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=5)
        assert reply.hostname == "spy" and spy.calls == 1
        # No token at all: on to the servicer, whose CallerIdentifier serves only local users.
        assert (await stub.GetInfo(pb.GetInfoRequest(), metadata=(("x-token", TOKEN),), timeout=5)).hostname
    assert spy.calls == 2



def test_a_group_readable_or_short_token_is_used_with_a_warning(tmp_path, caplog):
    token_file = write_token(tmp_path, "abc123")
    token_file.chmod(0o640)
    with caplog.at_level(logging.WARNING, logger="agentd.auth"):
        assert load_token(token_file) == "abc123"
    warnings = [r.getMessage() for r in caplog.records]
    assert any("readable by its group" in w and f"chmod 600 {token_file}" in w for w in warnings)
    assert any("fewer than 16 characters" in w for w in warnings)
    caplog.clear()
    good = write_token(tmp_path, TOKEN)
    with caplog.at_level(logging.WARNING, logger="agentd.auth"):
        assert load_token(good) == TOKEN
    assert not caplog.records
