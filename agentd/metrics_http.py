"""The HTTP endpoint for Prometheus: ``/metrics`` and ``/healthz``.

A stdlib ``ThreadingHTTPServer`` on one daemon thread (plus one per open
connection): no extra dependency, nothing on the asyncio loop that serves gRPC.
The exposition text itself comes from ``agentd.prometheus.render_metrics``,
after ``render_dynolog_metrics`` with ``--metric-names dynolog``; it is rendered
once per snapshot, by the first scrape that asks for it, and every scrape of
that snapshot is served the same bytes from memory.

Anyone local may connect, so what connections cost is bounded: at most
``MAX_CONNECTIONS`` are served at once, and at most ``MAX_CONNECTIONS_PER_PEER``
of one peer (the uid the kernel names for a loopback client, the address of a
remote one); a connection past either bound is answered 503 at once and closed,
so one user's scrapers never take the place of another user's, or of
``/healthz``.
The endpoint is read-only and, like node_exporter's, needs no token; it listens
on the same address as the gRPC port, so it is loopback-only unless a token is
configured, and it speaks HTTPS with the gRPC port's certificate when TLS is on.
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import ipaddress
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping

from agentd import peer
from agentd.agent import Agent
from agentd.errors import BindError
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectRun

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Pending connections the kernel queues before accept(). socketserver's default is
# 5: a burst of scrapers, health checks and curl (or one Prometheus HA pair plus a
# federation scrape on a busy node) would overflow it and see resets or SYN
# retransmits (1 s+ stalls); 128 is the usual listen backlog (SOMAXCONN's old value).
LISTEN_BACKLOG = 128
# Connections served at once (a thread each), and at most this many of one peer. A scrape is served from
# memory, so a connection holds its thread about as long as its client takes to read the bytes.
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_PEER = 8
# A snapshot older than this many intervals means the snapshot loop is stuck.
STALE_INTERVALS = 3

# (latest snapshot, the one before it or None, GetInfo's answer, the collectors' runs) -> exposition text
Renderer = Callable[[pb.HostSnapshot, pb.HostSnapshot | None, pb.AgentInfo, Mapping[str, CollectRun]], str]


def load_renderer(metric_names: str) -> Renderer | str:
    """The renderer for ``metric_names`` ("tuiprof" or "dynolog"), or the reason it cannot be loaded."""
    try:
        from agentd.prometheus import render_dynolog_metrics, render_metrics
    except ImportError as exc:
        return f"metrics rendering is not available: {exc}"
    if metric_names == "dynolog":
        return lambda latest, previous, info, runs: (render_dynolog_metrics(latest, previous)
                                                     + render_metrics(latest, info, runs))
    return lambda latest, previous, info, runs: render_metrics(latest, info, runs)


def consecutive_snapshots(agent: Agent) -> tuple[pb.HostSnapshot | None, pb.HostSnapshot | None]:
    """The agent's latest snapshot and the one just before it (None when it has none).

    Read from another thread while the agent publishes: a pair that is not one interval
    apart (read mid-publish) is read again; never a pair of the same snapshot.
    """
    for _ in range(3):
        previous, latest = agent.previous, agent.latest
        if latest is None or previous is None or previous.sequence + 1 == latest.sequence:
            return latest, previous
    return latest, None


class MetricsServer:
    """Serves ``/metrics`` and ``/healthz`` on ``host:port`` (bound at once, served after ``start``)."""

    _agent: Agent
    _info: Callable[[], pb.AgentInfo]

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None,
                 metric_names: str = "tuiprof") -> None:
        self._renderer = load_renderer(metric_names)
        self._rendering = threading.Lock()  # scrapes of a snapshot not yet rendered wait for its one rendering
        self._rendered: tuple[int, bytes] | None = None  # (the snapshot's sequence, its exposition)
        handler = _handler_class(self)
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise BindError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
        server_class = type("_FamilyServer", (_Server,), {"address_family": family})
        try:
            self._server = server_class((host, port), handler)
        except OSError as exc:
            raise BindError.for_port("metrics", host, port, exc, "--metrics-port") from None
        if tls is not None:
            # The handshake happens on the connection's own thread (first read), so a
            # client that stalls mid-handshake cannot hold up the accept loop.
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self._server.server_address[1]
        # No poll interval: the accept loop sleeps until a connection comes, and stop()
        # wakes it by shutting the listening socket down (socketserver polls every 0.5 s).
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(None,), name="metrics-http", daemon=True
        )

    def start(self, agent: Agent, info: Callable[[], pb.AgentInfo]) -> None:
        """Serve ``agent``'s snapshots; ``info`` gives GetInfo's answer for the labels."""
        self._agent = agent
        self._info = info
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, so only when it runs
            self._server.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept loop's select()
            self._server.shutdown()
        self._server.server_close()

    def health(self) -> tuple[int, bytes]:
        """200 while snapshots are fresh, 503 with the reason otherwise."""
        if self._agent.latest_monotonic is None:
            return 503, b"starting: no snapshot yet\n"
        age = time.monotonic() - self._agent.latest_monotonic
        if age > STALE_INTERVALS * self._agent.interval_seconds + 1:
            return 503, f"stale: last snapshot {age:.1f} s ago\n".encode()
        return 200, b"ok\n"

    def metrics(self) -> tuple[int, bytes]:
        """The latest snapshot's exposition, rendered by the first scrape that asks for it."""
        if isinstance(self._renderer, str):
            return 503, (self._renderer + "\n").encode()
        snapshot, previous = consecutive_snapshots(self._agent)
        if snapshot is None:
            return 503, b"starting: no snapshot yet\n"
        with self._rendering:
            if self._rendered is None or self._rendered[0] < snapshot.sequence:
                text = self._renderer(snapshot, previous, self._info(), self._agent.collector_runs())
                self._rendered = (snapshot.sequence, text.encode())
            return 200, self._rendered[1]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._open: collections.Counter[int | str] = collections.Counter()  # connections served, per peer
        self._open_lock = threading.Lock()

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket],
                        client_address: tuple[str, int]) -> None:
        """Serve the connection on a thread of its own, or answer 503 at once when its peer, or the
        server, has as many connections served as it may."""
        assert isinstance(request, socket.socket)  # a stream server's connection (the tuple is UDP's)
        who = _peer(client_address, self.server_address[1])
        with self._open_lock:
            if self._open[who] >= MAX_CONNECTIONS_PER_PEER:
                busy = f"busy: {MAX_CONNECTIONS_PER_PEER} connections of yours are being served; close one first"
            elif self._open.total() >= MAX_CONNECTIONS:
                busy = f"busy: {MAX_CONNECTIONS} connections are being served; try again in a moment"
            else:
                busy = ""
                self._open[who] += 1
        if busy:
            _refuse(request, busy)
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._serve, args=(request, client_address, who), daemon=True)
        thread.start()

    def _serve(self, request: socket.socket, client_address: tuple[str, int], who: int | str) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open[who] -= 1
                if not self._open[who]:
                    del self._open[who]

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """A client that resets or drops its connection (or its TLS session) mid-request is normal
        life for a server: one debug line. Anything else is a bug of ours, logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, ssl.SSLError)):
            log.debug("http client dropped the connection", extra={"client": client_address[0], "reason": str(error)})
        else:
            log.error("http request failed", extra={"client": client_address[0], "error": repr(error)},
                      exc_info=error)


def _peer(client_address: tuple[str, int], port: int) -> int | str:
    """Whose connection this is: the uid the kernel names for a loopback client, else its address."""
    host = client_address[0]
    ip = ipaddress.ip_address(host)
    if ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped and ip.ipv4_mapped.is_loopback):
        try:
            uid = peer.tcp_socket_uid(client_address[:2], ("::" if ":" in host else "0.0.0.0", port))
        except (OSError, peer.PeerLookupError):
            uid = None
        if uid is not None:
            return uid
    return host


def _refuse(request: socket.socket, reason: str) -> None:
    """A 503 with ``reason``, sent without waiting (plain HTTP only: a TLS connection is just closed)."""
    if isinstance(request, ssl.SSLSocket):
        return
    body = (reason + "\n").encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(OSError):  # the client is gone or its buffer full: closing says enough
        request.send(head + body, socket.MSG_DONTWAIT)


def _handler_class(owner: MetricsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body are separate writes; with Nagle on, a keep-alive client's
        # delayed ACK would hold the body back ~40 ms.
        disable_nagle_algorithm = True
        timeout = 10  # seconds a connection may sit idle or half-sent

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                status, body = owner.metrics()
            elif path == "/healthz":
                status, body = owner.health()
            else:
                status, body = 404, b"not found: try /metrics or /healthz\n"
            self._reply(status, body)

        def _reply(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http " + format, *args)

    return Handler
