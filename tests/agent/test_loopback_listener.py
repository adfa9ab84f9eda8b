"""``peer.tcp_listener``: who holds a listening port, per the kernel (uid and pids), for both loopback addresses;
and ``listen_hosts``: a loopback --host means both of them."""

from __future__ import annotations

import os
import socket

import pytest

from agentd import peer
from agentd.address import listen_hosts


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_listener_names_this_process(host):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as server:
        server.bind((host, 0))
        port = server.getsockname()[1]
        assert peer.tcp_listener((host, port)) is None  # bound, not listening: no listener yet
        server.listen()
        listener = peer.tcp_listener((host, port))
        assert listener is not None and listener.uid == os.getuid() and os.getpid() in listener.pids
        assert f"(uid {os.getuid()}), pid " in str(listener) and str(os.getpid()) in str(listener)
        twin = "::1" if host == "127.0.0.1" else "127.0.0.1"
        assert peer.tcp_listener((twin, port)) is None  # the other loopback address is free for anyone


def test_loopback_host_means_both_addresses():
    assert listen_hosts("127.0.0.1") == listen_hosts("::1") == listen_hosts("localhost") == ("127.0.0.1", "::1")
    assert listen_hosts("[::1]") == ("127.0.0.1", "::1")
    assert listen_hosts("10.0.0.5") == ("10.0.0.5",)
    assert listen_hosts("0.0.0.0") == ("0.0.0.0",)
