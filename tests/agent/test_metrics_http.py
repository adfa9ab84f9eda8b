"""Serving /metrics and /healthz over HTTP (the exposition text itself is agentd.prometheus's)."""

from __future__ import annotations

import json
import re
import resource
import socket
import struct
import time

import httpx

from agentd.agent import Agent
from agentd.metrics_http import MetricsServer
from agentd.prometheus import render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectorRunner
from testkit.agents import TickCollector, running_agent


def test_real_agent_serves_metrics_healthz_and_404(tmp_path):
    with (running_agent(tmp_path, host="127.0.0.2", extra_args=["--log-format", "json"]) as agent,
          httpx.Client(base_url=agent.metrics_url, timeout=5) as http):
        health = http.get("/healthz")
        metrics = http.get("/metrics")
        missing = http.get("/nope")
    log_lines = agent.log().splitlines()  # read once agentd has exited: no half-written line
    assert agent.process.returncode == 0  # SIGTERM is a clean stop
    assert health.status_code == 200 and health.text == "ok\n"
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert f'hostname="{socket.gethostname()}"' in metrics.text
    assert missing.status_code == 404 and "/metrics" in missing.text
    # --log-format json: every log line is one JSON object with the event's fields.
    entries = [json.loads(line) for line in log_lines]
    started = next(e for e in entries if e["message"] == "agentd listening")
    assert started["level"] == "info" and started["logger"] == "agentd.daemon"
    assert started["grpc"] == f"127.0.0.2:{agent.port}" and started["token_required"] is False
    assert started["grpc_serving"] is True  # agentd serves at once (only the console's embedded agent waits)
    assert entries[-1]["message"] == "agentd stopped"


def test_healthz_reports_starting_and_stale_snapshots():
    agent = Agent([], interval_seconds=0.1)
    server = MetricsServer("127.0.0.1", 0)
    server.start(agent, lambda: pb.AgentInfo())
    try:
        url = f"http://127.0.0.1:{server.port}"
        starting = httpx.get(f"{url}/healthz", timeout=5)
        assert starting.status_code == 503 and starting.text.startswith("starting")
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 503
        agent.publish(agent.snapshot())
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        agent.latest_monotonic -= 10  # the snapshot loop stopped 10 s ago
        stale = httpx.get(f"{url}/healthz", timeout=5)
        assert stale.status_code == 503 and stale.text.startswith("stale: last snapshot 10.")
    finally:
        server.stop()


def test_a_burst_of_connections_waits_in_the_listen_backlog():
    # Bound but not yet serving: nothing accepts, so every connection that completes
    # its handshake sits in the kernel's accept queue. With socketserver's default
    # backlog of 5 the 7th SYN would be dropped and connect() would stall.
    server = MetricsServer("127.0.0.1", 0)
    clients = []
    try:
        for _ in range(64):
            clients.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.5))
    finally:
        for client in clients:
            client.close()
        server.stop()
    assert len(clients) == 64


def test_metrics_carry_each_collectors_timing_measured_by_its_runner():
    tick = TickCollector(0.01)
    runner = CollectorRunner(tick)
    agent = Agent([runner], interval_seconds=0.1, hostname="h")
    server = MetricsServer("127.0.0.1", 0)
    server.start(agent, lambda: pb.AgentInfo())
    runner.start()
    try:
        assert runner.wait_first_sample(5)
        agent.publish(agent.snapshot())
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
        tick.fail_collect = "sensor gone"
        deadline = time.monotonic() + 5
        while runner.last_run.success and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.publish(agent.snapshot())  # an exposition is rendered once per snapshot: the failure shows in the next
        failed = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
    finally:
        runner.stop()
        server.stop()
    duration = re.search(r'^tuiprof_collector_duration_seconds\{hostname="h",collector="tick"\} (\S+)$', text, re.M)
    assert duration and 0 < float(duration[1]) < 1.0
    assert 'tuiprof_collector_success{hostname="h",collector="tick"} 1\n' in text
    assert 'tuiprof_collector_success{hostname="h",collector="tick"} 0\n' in failed


class BusyOrIdleCollector(TickCollector):
    """Each collect() computes until the kernel has counted ``WORK_S`` of CPU to its thread
    (``busy``; getrusage, not the runner's clock), or sleeps ``WORK_S``."""

    WORK_S = 0.2

    def __init__(self, name: str, busy: bool) -> None:
        super().__init__(interval_seconds=60)
        self.name, self.busy = name, busy

    def collect(self) -> None:
        if not self.busy:
            time.sleep(self.WORK_S)
            return
        start = thread_cpu_seconds()
        while thread_cpu_seconds() - start < self.WORK_S:
            pass


def thread_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def test_collector_cpu_seconds_count_the_cpu_not_the_wait():
    """Both collectors take at least 0.2 s a call, each on its runner's thread; only the one
    computing adds them to its CPU seconds (the runner's clock is the thread's CPU time, not the
    wall, which also counts sleeps and GIL waits: here the two threads share the GIL)."""
    runners = [CollectorRunner(BusyOrIdleCollector("busy", True)), CollectorRunner(BusyOrIdleCollector("idle", False))]
    for runner in runners:
        runner.start()
    try:
        assert all(runner.wait_first_sample(10) for runner in runners)
    finally:
        for runner in runners:
            runner.stop()
    agent = Agent(runners, interval_seconds=0.1, hostname="h")
    text = render_metrics(agent.snapshot(), pb.AgentInfo(), agent.collector_runs())
    cpu = dict(re.findall(r'^tuiprof_collector_cpu_seconds_total\{hostname="h",collector="(\w+)"\} (\S+)$', text, re.M))
    busy, idle = (runner.last_run for runner in runners)
    assert BusyOrIdleCollector.WORK_S - 0.001 <= float(cpu["busy"]) <= busy.duration_seconds + 0.001, (cpu, busy)
    assert float(cpu["idle"]) < 0.02 and idle.duration_seconds >= BusyOrIdleCollector.WORK_S, (cpu, idle)


def reset_mid_request(port: int, path: str) -> None:
    """Send a request, then close with SO_LINGER 0 (an RST, not a FIN) before reading the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_clients_resetting_mid_request_leave_no_traceback_and_the_server_answering(tmp_path):
    with running_agent(tmp_path, extra_args=["--log-format", "json"]) as agent:
        port = int(agent.metrics_url.rsplit(":", 1)[1])
        for _ in range(25):
            for path in ("/healthz", "/metrics"):
                reset_mid_request(port, path)
        with httpx.Client(base_url=agent.metrics_url, timeout=5) as http:
            assert http.get("/healthz").status_code == 200
            assert http.get("/metrics").status_code == 200
    log_text = agent.log()
    assert "Traceback" not in log_text and "Exception occurred" not in log_text, log_text[-3000:]
    assert all(json.loads(line) for line in log_text.splitlines())  # nothing but structured lines
