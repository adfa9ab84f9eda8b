"""The Kineto IPC endpoint against libkineto's exact framing, and against garbage: it keeps serving
and logs one line per cause."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator

import pytest

from agentd.kineto import wire
from agentd.kineto.endpoint import ABSTRACT_NAME, EndpointError, KinetoEndpoint, socket_address
from agentd.kineto.registry import PendingConfig, Registry
from testkit.traces import KinetoClient


@pytest.fixture
def socket_dir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def endpoint(socket_dir: pathlib.Path) -> Iterator[KinetoEndpoint]:
    served = KinetoEndpoint(Registry(), str(socket_dir))
    yield served
    served.close()


def test_wire_layout_matches_libkineto():
    # Byte sequences from research/dynolog.md §1.6 (captured from libkineto's own structs).
    poll = wire.poll_request(3, 12345, (12373, 12275))
    assert poll == (struct.pack("<Q", 24) + b"req" + b"\0" * 29
                    + bytes.fromhex("03000000 02000000 3930000000000000 55300000 f32f0000"))
    assert wire.parse(poll) == wire.PollMessage(3, 12345, (12373, 12275))
    ctxt = wire.context_request(0, 12373, 12345)
    assert len(ctxt) == 56 and wire.parse(ctxt) == wire.ContextMessage(0, 12373, 12345)
    assert wire.poll_reply("") == struct.pack("<Q", 0) + b"req" + b"\0" * 29
    assert wire.context_reply(1) == struct.pack("<Q", 4) + b"ctxt" + b"\0" * 28 + b"\1\0\0\0"


def test_abstract_address_keeps_the_trailing_nul():
    assert socket_address(None) == ABSTRACT_NAME == b"\0dynolog\0"
    with pytest.raises(EndpointError, match="longer than"):
        socket_address("/" + "d" * 120)


def test_poll_answered_empty_then_config_once_and_only_for_activities(endpoint, socket_dir):
    client = KinetoClient(socket_dir)
    try:
        started = time.monotonic()
        client.send(wire.poll_request(3, 7, (os.getpid(), os.getppid())))
        assert client.reply() == wire.poll_reply("")
        assert time.monotonic() - started < 0.09  # libkineto waits ~90 ms
        [entry] = endpoint.registry.entries()
        assert entry.host_pid == os.getpid() and entry.uid == os.geteuid() and entry.job_id == "7"
        config = PendingConfig("ACTIVITIES_DURATION_MSECS=500\n")
        endpoint.registry.offer(entry, config)
        client.send(wire.poll_request(1, 7, (os.getpid(), os.getppid())))  # busy: no activities bit
        assert client.reply() == wire.poll_reply("")
        assert config.delivered_at is None
        client.send(wire.poll_request(3, 7, (os.getpid(), os.getppid())))
        assert client.reply() == wire.poll_reply("ACTIVITIES_DURATION_MSECS=500\n")
        assert config.delivered_at is not None
        client.send(wire.poll_request(3, 7, (os.getpid(), os.getppid())))
        assert client.reply() == wire.poll_reply("")
        client.send(wire.context_request(0, os.getpid(), 7))
        assert client.reply() == wire.context_reply(1)
    finally:
        client.close()


BAD_DATAGRAMS = {
    "truncated": b"\x10\0\0",
    "size-mismatch": struct.pack("<Q32s", 99, b"req") + b"\0" * 20,
    "unknown-type": wire.encode(b"hello", b"\0" * 8),
    "bad-req": wire.encode(b"req", struct.pack("<iiq", 3, 0, 0)),  # zero pids
    "bad-ctxt": wire.encode(b"ctxt", b"\0" * 3),
}


def test_garbage_is_ignored_logged_once_per_cause_and_service_goes_on(endpoint, socket_dir, caplog):
    caplog.set_level(logging.WARNING, logger="agentd.kineto.endpoint")
    client = KinetoClient(socket_dir)
    try:
        for _ in range(3):
            for datagram in BAD_DATAGRAMS.values():
                client.send(datagram)
        client.send(b"x" * 70_000)  # larger than the receive buffer
        client.send(wire.poll_request(3, 0, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")  # the only reply: garbage gets none
        with pytest.raises(TimeoutError):
            client.sock.settimeout(0.2)
            client.reply()
    finally:
        client.close()
    causes = [r.cause for r in caplog.records]
    assert sorted(causes) == sorted([*BAD_DATAGRAMS, "oversized"])
    assert endpoint.stats().rejected == {**dict.fromkeys(BAD_DATAGRAMS, 3), "oversized": 1}


def test_flood_of_polls_is_answered_and_bad_clients_do_not_stop_it(endpoint, socket_dir, caplog):
    caplog.set_level(logging.WARNING, logger="agentd.kineto.endpoint")
    # Clients that poll and vanish before the reply: holding the registry's lock keeps
    # the endpoint from answering until they are gone.
    with endpoint.registry._lock:
        for _ in range(5):
            gone = KinetoClient(socket_dir)
            gone.send(wire.poll_request(3, 0, (os.getpid(), 1)))
            gone.close()
    greedy = KinetoClient(socket_dir)  # polls without ever reading: its queue fills (net.unix.max_dgram_qlen)
    for _ in range(300):
        greedy.send(wire.poll_request(3, 0, (os.getpid(), 2)))
    client = KinetoClient(socket_dir)
    try:
        floods = 2000
        started = time.monotonic()
        for _ in range(floods // 8):  # bursts of 8 polls, then their 8 replies
            for _ in range(8):
                client.send(wire.poll_request(3, 0, (os.getpid(),)))
            for _ in range(8):
                assert client.reply() == wire.poll_reply("")
        elapsed = time.monotonic() - started
    finally:
        client.close()
        greedy.close()
    assert elapsed < 10, f"{floods} polls took {elapsed:.1f} s"
    rejected = endpoint.stats().rejected
    assert rejected["client-gone"] == 5 and rejected["client-full"] > 0
    causes = [r.cause for r in caplog.records]
    assert causes.count("client-gone") == 1 and causes.count("client-full") == 1


def test_collector_unavailable_with_reason_when_dynolog_holds_the_name():
    # In a private network namespace (abstract socket names are per namespace),
    # hold @dynolog@ as a running dynolog would, then start the agent's collector.
    script = textwrap.dedent("""
        import socket
        from agentd.kineto.collector import KinetoCollector
        from agentd.kineto.registry import Registry
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        holder.bind(b"\\0dynolog\\0")
        status = KinetoCollector(1.0, Registry(), None).status()
        print(status.available, status.reason)
    """)
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    result = subprocess.run(["unshare", "-n", sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, cwd=pathlib.Path(__file__).parents[2])
    if result.returncode != 0 and "Operation not permitted" in result.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("False cannot bind the Kineto IPC socket @dynolog@ (abstract)")
    # The holder is named: this test's own process, root's (issue 24 item 8).
    assert "(dynolog, another agentd, or a squatter)" in result.stdout and "of user root (uid 0)" in result.stdout
