"""Putting agentd together: check the settings, bind every port, then start sampling.

Everything that can fail on bad input (token, TLS files, trace dir, ports) is
done before any collector thread starts, so a mistake ends the process at once
with one ``AgentdError``. ``Daemon`` is used by the CLI and by the embedded agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import pathlib
import socket
import ssl
from collections.abc import Callable, Sequence

import grpc

from agentd.agent import Agent
from agentd.auth import BearerTokenInterceptor, CallerIdentifier, check_exposure, load_token
from agentd.config import AgentConfig
from agentd.errors import BindError, ConfigError, TlsError
from agentd.function_timing import FunctionTimingService
from agentd.hang.service import HangService
from agentd.slowdown.verdict import SlowdownJudge
from agentd.metrics_http import MetricsServer
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.registry import COLLECTORS
from agentd.runner import CollectorRunner, load_collectors
from agentd.server import AgentServicer, FunctionTimingSwitch, StacksService, TraceService, agent_info, static_info
from agentd.sinks import JsonLinesSink
from agentd.traces.service import CaptureService
from agentd.address import AgentAddress, listen_hosts

log = logging.getLogger(__name__)

# Seconds in-flight calls get to finish when agentd stops.
STOP_GRACE_SECONDS = 1.0
# The largest request gRPC will parse. Real requests are a few kB (4096 pids fit in
# 20 kB); a bigger one is refused by gRPC (RESOURCE_EXHAUSTED) before any handler runs.
MAX_REQUEST_BYTES = 256 * 1024


def build_services(config: AgentConfig, agent: Agent
                   ) -> tuple[TraceService | None, StacksService | None, FunctionTimingSwitch | None]:
    """The trace, stacks and function timing services the gRPC servicer delegates to (None: not wired
    in); the slowdown verdict judges every snapshot after the hang verdict."""
    services = (CaptureService.attach(config, agent), HangService.attach(config, agent),
                FunctionTimingService.attach(agent))
    agent.post_processors.append(SlowdownJudge().fill)
    return services


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """Where a started agent listens (ports are the bound ones, also when 0 was asked for)."""

    host: str
    grpc_port: int
    metrics_port: int | None
    tls: bool
    token_required: bool

    @property
    def address(self) -> AgentAddress:
        return AgentAddress(self.host, self.grpc_port)


@dataclasses.dataclass(frozen=True)
class _Tls:
    """One certificate and key, loaded for both servers."""

    grpc: grpc.ServerCredentials
    http: ssl.SSLContext


def _load_tls(config: AgentConfig) -> _Tls | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    try:
        # ssl gives a precise message for bad PEM or a key that does not match.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(config.tls_cert, config.tls_key)
        key, cert = config.tls_key.read_bytes(), config.tls_cert.read_bytes()
    except (OSError, ssl.SSLError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TlsError(
            f"cannot use TLS certificate {config.tls_cert} with key {config.tls_key}: {detail}; "
            "give a PEM certificate and its matching PEM private key"
        ) from None
    return _Tls(grpc.ssl_server_credentials([(key, cert)]), context)


def _prepare_trace_dir(path: pathlib.Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o750)
    except OSError as exc:
        raise ConfigError(
            f"cannot create trace directory {path}: {exc.strerror}; choose another with --trace-dir"
        ) from None


def _check_distinct_ports(config: AgentConfig) -> None:
    """Both servers on one port would fail as "in use (another agentd?)": say what is wrong."""
    if config.port != 0 and config.port == config.metrics_port:
        raise ConfigError(f"--port and --metrics-port are both {config.port}; "
                          "gRPC and /metrics need two different ports")


def _probe_grpc_port(host: str, port: int) -> None:
    """Raise the BindError grpc would hit, with its cause (grpc itself only says "failed").

    The probe binds as grpc does, with SO_REUSEADDR: connections of a just-stopped
    agent left in TIME_WAIT must not stop its restart (a listening socket still does).
    """
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except socket.gaierror as exc:
        raise BindError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    except OSError as exc:
        raise BindError.for_port("gRPC", host, port, exc, "--port") from None


def _hosts_to_bind(host: str) -> list[str]:
    """The addresses to listen on for ``--host``: both loopback addresses for a loopback one
    (``listen_hosts``), less ::1 where this kernel has no IPv6 loopback (logged, with why)."""
    hosts = list(listen_hosts(host))
    if "::1" in hosts and host.strip("[]") != "::1":
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind(("::1", 0))
        except OSError as exc:
            hosts.remove("::1")
            log.warning("not listening on ::1: this host has no IPv6 loopback; clients refuse to send their "
                        "token to another user's listener there", extra={"reason": exc.strerror or str(exc)})
    return hosts


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket holding ``host:port`` (0: a free port) for a gRPC server started later.

    Bound and not listening, so a connection made before the server starts is refused.
    With SO_REUSEPORT, the later gRPC socket (also SO_REUSEPORT) binds beside it; Linux
    lets sockets share a port that way only under the same uid, so no other user can take
    the port meanwhile. Not SO_REUSEADDR: beside a socket that does not listen, that would
    let another user's SO_REUSEADDR socket bind the port too.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise BindError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    reserved = socket.socket(family, kind, proto)
    try:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind(address)
    except OSError as exc:
        reserved.close()
        raise BindError.for_port("gRPC", host, port, exc, "--port") from None
    return reserved


class Daemon:
    """One running agent: collectors, gRPC server, metrics endpoint, JSON sink."""

    def __init__(self, config: AgentConfig, collectors: Sequence[str] = COLLECTORS,
                 on_start: Callable[[Agent], None] = lambda agent: None, grpc_on_demand: bool = False) -> None:
        """``on_start``: called with the agent once its collectors started, before its first snapshot.

        ``grpc_on_demand``: the gRPC port is bound at start, and served only from ``serve_grpc()``
        on. gRPC's threads wake about eight times a second even when no call comes, ~0.3 ms of
        CPU a second (bench/console/console_nvitop.md, run 10): the console's embedded agent is called
        over gRPC only when its user asks for a trace, stacks or a file.
        """
        self.config = config
        self._collector_entries = collectors
        self._on_start = on_start
        self._grpc_on_demand = grpc_on_demand
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._hosts: list[str] = []  # the addresses every port is bound on (_hosts_to_bind)
        self._reserved: list[socket.socket] = []  # the gRPC port on each host, held until served (grpc_on_demand)
        self._serving = asyncio.Lock()
        self._servicer: AgentServicer | None = None
        self._tls: _Tls | None = None
        self._token: str | None = None
        self._metrics: list[MetricsServer] = []  # one per host
        self._sink: JsonLinesSink | None = None
        self.agent: Agent | None = None
        self._static: pb.AgentInfo | None = None

    async def start(self) -> Endpoints:
        """Check, bind and start everything; on any failure nothing is left running."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or the snapshot loop dies (its error is raised)."""
        stopper = asyncio.create_task(stop.wait())
        snapshots = self._tasks[0]
        await asyncio.wait([stopper, snapshots], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        failure = snapshots.exception() if snapshots.done() else None
        await self.stop()
        if failure is not None:
            raise failure

    async def _start(self) -> Endpoints:
        config = self.config
        token = self._token = load_token(config.token_file)
        tls = self._tls = _load_tls(config)
        check_exposure(config.host, token, tls is not None, config.allow_plaintext_token)
        _prepare_trace_dir(config.trace_dir)
        _check_distinct_ports(config)

        # Bind every port and open the sink before any collector starts, so that
        # these mistakes end agentd at once with one line and nothing else logged.
        # A port 0 (a free port, which the agent tells its clients as host:port, e.g. the console's
        # embedded agent) is bound on --host only: no client reaches it by guessing, as by `localhost`.
        hosts = _hosts_to_bind(config.host) if config.port or config.metrics_port else [config.host]
        grpc_hosts = self._hosts = hosts if config.port else [config.host]
        grpc_port = config.port  # 0 until the first host is bound, then the port every other host binds
        if self._grpc_on_demand:
            for host in grpc_hosts:
                self._reserved.append(_reserve_port(host, grpc_port))
                grpc_port = self._reserved[-1].getsockname()[1]
        else:
            self._server = self._new_grpc_server(reuse_port=False)
            for host in grpc_hosts:
                _probe_grpc_port(host, grpc_port)
                grpc_port = self._add_grpc_port(self._server, host, grpc_port)
        if config.metrics_port is not None:
            metrics_hosts = hosts if config.metrics_port else [config.host]
            metrics_port = config.metrics_port  # as grpc_port
            for host in metrics_hosts:
                self._metrics.append(MetricsServer(host, metrics_port, tls.http if tls is not None else None,
                                                   config.metric_names))
                metrics_port = self._metrics[-1].port
        if config.json_sink is not None:
            self._sink = JsonLinesSink.open(config.json_sink)

        runners = [CollectorRunner(c)
                   for c in load_collectors(self._collector_entries, config.interval_seconds)]
        agent = self.agent = Agent(runners, config.interval_seconds)
        static = self._static = static_info(agent, str(config.trace_dir))
        traces, stacks, functions = build_services(config, agent)
        callers = CallerIdentifier(token_required=token is not None, port=grpc_port)
        self._servicer = AgentServicer(agent, static, callers, traces, stacks, functions)

        agent.start_collectors()
        self._on_start(agent)
        if self._server is not None:
            pb_grpc.add_AgentServicer_to_server(self._servicer, self._server)
            await self._server.start()
        self._tasks.append(asyncio.create_task(agent.run(), name="snapshots"))
        for metrics in self._metrics:
            metrics.start(agent, lambda: agent_info(agent, static))
        if self._sink is not None:
            self._tasks.append(asyncio.create_task(self._sink.run(agent), name="json-sink"))
        endpoints = Endpoints(config.host, grpc_port,
                              self._metrics[0].port if self._metrics else None,
                              tls=tls is not None, token_required=token is not None)
        log.info("agentd listening", extra={
            "grpc": " ".join(AgentAddress(host, grpc_port).target for host in grpc_hosts),
            "grpc_serving": self._server is not None,
            "metrics_port": endpoints.metrics_port,
            "tls": endpoints.tls, "token_required": endpoints.token_required,
            "interval_ms": config.interval_ms,
            "collectors": ",".join(f"{s.name}={'ok' if s.available else 'unavailable'}"
                                   for s in agent.statuses()),
        })
        for status in agent.statuses():
            if not status.available:
                log.info("collector unavailable",
                         extra={"collector": status.name, "reason": status.reason})
        return endpoints

    def _new_grpc_server(self, reuse_port: bool) -> grpc.aio.Server:
        """A gRPC server with the token check, bound to nothing yet."""
        return grpc.aio.server(
            interceptors=[BearerTokenInterceptor(self._token)] if self._token else None,
            options=[("grpc.so_reuseport", int(reuse_port)), ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)],
        )

    def _add_grpc_port(self, server: grpc.aio.Server, host: str, port: int) -> int:
        """Bind ``server`` to ``host:port`` (0: a free port); the port bound."""
        target = AgentAddress(host, port).target
        try:
            bound: int = (server.add_insecure_port(target) if self._tls is None
                          else server.add_secure_port(target, self._tls.grpc))
            return bound
        except RuntimeError:  # lost a race for the port since the probe
            raise BindError(f"cannot listen on {target} for gRPC; check --host and --port") from None

    async def serve_grpc(self) -> None:
        """Serve gRPC on the port held since start (``grpc_on_demand``); once, later calls return at once.
        Raises BindError when gRPC cannot listen there (the port stays held)."""
        async with self._serving:
            if not self._reserved:
                return
            server = self._new_grpc_server(reuse_port=True)
            targets = []
            for host, reserved in zip(self._hosts, self._reserved, strict=True):
                port = self._add_grpc_port(server, host, reserved.getsockname()[1])
                targets.append(AgentAddress(host, port).target)
            assert self._servicer is not None  # set by a successful start
            pb_grpc.add_AgentServicer_to_server(self._servicer, server)
            await server.start()
            self._server = server
            self._close_reserved()
            log.info("agentd serving gRPC", extra={"grpc": " ".join(targets)})

    def _close_reserved(self) -> None:
        for reserved in self._reserved:
            reserved.close()
        self._reserved.clear()

    def info(self) -> pb.AgentInfo:
        """What GetInfo answers now (call it on the agent's loop, once started)."""
        assert self.agent is not None and self._static is not None
        return agent_info(self.agent, self._static)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(STOP_GRACE_SECONDS)
        self._close_reserved()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # a task's own failure was already reported by serve_until
        self._tasks.clear()
        for metrics in self._metrics:
            metrics.stop()
        self._metrics.clear()
        if self.agent is not None:
            await asyncio.to_thread(self.agent.stop_collectors)
        if self._sink is not None:
            self._sink.close()
            self._sink = None
