"""A real Prometheus server scrapes a real agentd and answers queries about this host.

Prometheus (Debian package, /usr/bin/prometheus) runs with a temporary config
and TSDB, scraping agentd's /metrics every second; the test then asks
Prometheus's HTTP API, not the agent, for the host metrics.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from testkit.agents import RunningAgent, running_agent, stop_process
from testkit.ports import free_port

PROMETHEUS = shutil.which("prometheus")
QUERY_TIMEOUT_SECONDS = 40.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt package prometheus)"),
]


@pytest.fixture
def agent(tmp_path: pathlib.Path) -> Iterator[RunningAgent]:
    with running_agent(tmp_path, interval_ms=500) as running:
        yield running


@pytest.fixture
def prometheus(tmp_path: pathlib.Path, agent: RunningAgent) -> Iterator[str]:
    with prometheus_scraping(tmp_path, agent) as url:
        yield url


@contextlib.contextmanager
def prometheus_scraping(tmp_path: pathlib.Path, agent: RunningAgent) -> Iterator[str]:
    """Prometheus scraping ``agent`` every second; yields its base URL."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: agentd\n    static_configs:\n"
        f"      - targets: ['{agent.host}:{agent.metrics_port}']\n"
    )
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)
        if process.returncode not in (0, -15):
            print(log_path.read_text(errors="replace"))


def query_until(base_url: str, promql: str, enough: int = 1) -> list[dict[str, Any]]:
    """Ask Prometheus until ``promql`` returns at least ``enough`` series (or time out)."""
    deadline = time.monotonic() + QUERY_TIMEOUT_SECONDS
    last: Any = None
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(f"{base_url}/api/v1/query", params={"query": promql}, timeout=5)
            if reply.status_code != 200:  # e.g. 503 "Service Unavailable" (plain text) while it starts
                last = f"{reply.status_code} {reply.text[:200]}"
            else:
                last = reply.json()
                if len(last["data"]["result"]) >= enough:
                    return last["data"]["result"]
        except httpx.TransportError as error:  # Prometheus still starting
            last = error
        time.sleep(0.5)
    raise AssertionError(f"no result for {promql!r} within {QUERY_TIMEOUT_SECONDS} s; last answer: {last}")


def test_prometheus_scrapes_host_metrics_from_agentd(prometheus: str, agent: RunningAgent) -> None:
    up = query_until(prometheus, 'up{job="agentd"} == 1')
    assert up[0]["metric"]["instance"] == f"{agent.host}:{agent.metrics_port}"

    memory = query_until(prometheus, "tuiprof_memory_total_bytes")
    assert float(memory[0]["value"][1]) == psutil.virtual_memory().total
    hostname = memory[0]["metric"]["hostname"]
    assert hostname

    modes = query_until(prometheus, "tuiprof_cpu_usage_ratio", enough=10)
    assert {series["metric"]["mode"] for series in modes} == {
        "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"}
    assert 0.0 < sum(float(series["value"][1]) for series in modes) <= 1.0 + 1e-9

    cores = query_until(prometheus, 'tuiprof_cpu_core_usage_ratio{mode="idle"}', enough=psutil.cpu_count())
    assert sorted(int(series["metric"]["cpu"]) for series in cores) == list(range(psutil.cpu_count()))

    # counters work with rate(): loopback traffic from the scrapes themselves is visible
    received = query_until(prometheus, 'rate(tuiprof_network_receive_bytes_total{nic="lo"}[5s]) > 0')
    assert float(received[0]["value"][1]) > 0

    gpu = query_until(prometheus, 'tuiprof_collector_up{collector="gpu"}')
    gpu_infos = httpx.get(f"{prometheus}/api/v1/query", params={"query": "tuiprof_gpu_info"}, timeout=5).json()
    if float(gpu[0]["value"][1]) == 0.0:  # a GPU-less machine (CI): the reason is there, no GPU series
        assert gpu[0]["metric"]["reason"].startswith("NVML: ")
        assert gpu_infos["data"]["result"] == []
    else:
        assert gpu_infos["data"]["result"]


def test_prometheus_scrapes_dynolog_names_when_asked(tmp_path: pathlib.Path) -> None:
    """A dashboard built for dynolog queries bare names by host_name (and net per NIC): they answer."""
    with running_agent(tmp_path, interval_ms=500, extra_args=["--metric-names", "dynolog"]) as agent, \
            prometheus_scraping(tmp_path, agent) as url:
        user_ms = query_until(url, f'cpu_u_ms{{host_name="{socket.gethostname()}"}}')
        assert 0.0 <= float(user_ms[0]["value"][1]) <= 500.0 * (psutil.cpu_count() or 1) + 20.0  # ms in one 0.5 s interval
        received = query_until(url, 'max_over_time(rx_bytes{net="lo"}[10s]) > 0')  # the scrapes' own traffic
        assert received[0]["metric"]["host_name"] == socket.gethostname()
        assert query_until(url, "uptime > 0") and query_until(url, "tuiprof_memory_total_bytes")
