"""agentd.peer against real sockets: the kernel's answer for our own sockets and a second user's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from agentd import peer


@pytest.fixture
def listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server


def test_listen_socket_owner_is_us(listener) -> None:
    port = listener.getsockname()[1]
    assert peer.tcp_socket_uid(("127.0.0.1", port), None) == os.getuid()


def test_connected_socket_owner_is_us(listener) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as client:
        accepted, address = listener.accept()
        with accepted:
            assert address == client.getsockname()
            assert peer.tcp_socket_uid(address, ("127.0.0.1", port)) == os.getuid()
            assert peer.grpc_peer_uid(f"ipv4:{address[0]}:{address[1]}", port) == os.getuid()


def test_ipv6_wildcard_listener_and_client() -> None:
    with socket.socket(socket.AF_INET6) as server:
        server.bind(("::", 0))
        server.listen()
        port = server.getsockname()[1]
        assert peer.tcp_socket_uid(("::1", port), None) == os.getuid()
        assert peer.tcp_socket_uid(("127.0.0.1", port), None) == os.getuid()  # dual stack
        with socket.create_connection(("::1", port)) as client:
            local = client.getsockname()
            assert peer.grpc_peer_uid(f"ipv6:[::1]:{local[1]}", port) == os.getuid()


def test_no_such_socket_is_none() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening nor connected
    assert peer.tcp_socket_uid(("127.0.0.1", port), None) is None
    assert peer.tcp_socket_uid(("127.0.0.1", port), ("127.0.0.1", 1)) is None


@pytest.mark.parametrize("text, expected", [
    ("ipv4:127.0.0.1:54321", ("127.0.0.1", 54321)),
    ("ipv6:[::1]:80", ("::1", 80)),
    ("unix:/run/x.sock", None),
    ("ipv4:not-an-ip:1", None),
])
def test_grpc_peer_address(text, expected) -> None:
    assert peer.grpc_peer_address(text) == expected


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid (setpriv)")
def test_other_users_connection_is_theirs(listener) -> None:
    """A connection made by uid 65534 (nobody) is reported as 65534's, not ours."""
    port = listener.getsockname()[1]
    client = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable, "-c",
         f"import socket,sys; c=socket.create_connection(('127.0.0.1',{port})); sys.stdin.read()"],
        stdin=subprocess.PIPE)
    try:
        accepted, address = listener.accept()
        with accepted:
            assert peer.tcp_socket_uid(address, ("127.0.0.1", port)) == 65534
    finally:
        client.kill()
        client.wait()
