"""A real Prometheus for console tests and benches: started on a free port with its own TSDB,
optionally backfilled first with a synthetic fleet through ``promtool tsdb create-blocks-from openmetrics``.

    with running_prometheus(tmp_path, file_sd=targets_json) as url: ...
    backfill(tmp_path / "tsdb", fleet_openmetrics(10_000, gpus=1, at=[now - 30]))
    with running_prometheus(tmp_path, storage=tmp_path / "tsdb") as url: ...

The synthetic fleet writes the series the cluster view reads, with the names and
labels agentd.prometheus exports (checked against a real agent's exposition by
tests/console/test_prometheus_fleet.py).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import pathlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import httpx

from agentd.prometheus import render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.agents import agentd_command, healthz_status, stop_process
from testkit.ports import free_port

PROMETHEUS = shutil.which("prometheus")
RECORDING_RULES = pathlib.Path(__file__).parents[2] / "docs" / "prometheus" / "tuiprof-rules.yml"
PROMTOOL = shutil.which("promtool")
READY_TIMEOUT_S = 60.0


class PrometheusStartError(RuntimeError):
    """Prometheus exited or never became ready; the message carries its log."""


@contextlib.contextmanager
def running_prometheus(
    directory: pathlib.Path,
    file_sd: pathlib.Path | None = None,
    storage: pathlib.Path | None = None,
    scrape_interval: str = "1s",
    rule_files: Sequence[pathlib.Path] = (),
    out_of_order_window: str = "",
    evaluation_interval: str = "",
) -> Iterator[str]:
    """A Prometheus scraping the targets in ``file_sd`` (none when None) into ``storage``
    (default ``directory/tsdb``), evaluating ``rule_files`` every ``evaluation_interval``
    (default: the scrape interval),
    accepting samples up to ``out_of_order_window`` (e.g. "1h") older than the newest: rule
    results over a backfill that reaches into the future are refused without it;
    yields its base URL once ``/-/ready`` answers."""
    assert PROMETHEUS is not None, "prometheus not installed (apt package prometheus)"
    port = free_port()
    config = directory / "prometheus.yml"
    lines = [f"global:\n  scrape_interval: {scrape_interval}\n"
             f"  evaluation_interval: {evaluation_interval or scrape_interval}\n"]
    if out_of_order_window:  # appends older than a backfilled block's end are refused without it
        lines.append(f"storage:\n  tsdb:\n    out_of_order_time_window: {out_of_order_window}\n")
    if rule_files:
        lines.append("rule_files:\n" + "".join(f"  - '{path}'\n" for path in rule_files))
    if file_sd is not None:
        lines.append("scrape_configs:\n  - job_name: tuiprof\n    file_sd_configs:\n"
                     f"      - files: ['{file_sd}']\n        refresh_interval: 1s\n")
    config.write_text("".join(lines))
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={storage or directory / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log_path)
        yield url
    finally:
        stop_process(process)


@contextlib.contextmanager
def named_agent(directory: pathlib.Path, name: str, port: int, metrics_port: int,
                address: str | None = None, extra_args: Sequence[str] = ()) -> Iterator[None]:
    """A real agentd whose host name is ``name`` (its own UTS namespace: needs root and
    unshare), listening on ``address`` (default: ``name``, an address or a resolvable name),
    with ``extra_args`` (e.g. short hang thresholds)."""
    address = address or name
    trace_dir = directory / f"traces-{name}"
    command = agentd_command(["--host", address, "--port", str(port), "--metrics-port", str(metrics_port),
                              "--interval-ms", "500", "--trace-dir", str(trace_dir), *extra_args])
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    log_path = directory / f"agentd-{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', name,
                                    *command], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while healthz_status(address, metrics_port) != 200:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        yield
    finally:
        stop_process(process)


def _exposition(snapshot: pb.HostSnapshot) -> bytes:
    return render_metrics(snapshot, pb.AgentInfo(hostname=snapshot.hostname, agent_version="0.9.0")).encode()


@contextlib.contextmanager
def frozen_agent(address: str, port: int, snapshot: pb.HostSnapshot) -> Iterator[None]:
    """agentd's exposition of one snapshot, served as /metrics on ``address:port`` whenever scraped:
    an agent whose sampling stopped at the snapshot's time (long ago for an old snapshot)."""
    body = _exposition(snapshot)
    with _serving_metrics(address, port, lambda: body):
        yield


@contextlib.contextmanager
def ticking_agent(address: str, port: int, snapshot_at: Callable[[float], pb.HostSnapshot]) -> Iterator[None]:
    """agentd's exposition of a new snapshot at every scrape, ``snapshot_at(time.time())``, served
    as /metrics on ``address:port``: an agent whose figures change with every snapshot."""
    with _serving_metrics(address, port, lambda: _exposition(snapshot_at(time.time()))):
        yield


@contextlib.contextmanager
def _serving_metrics(address: str, port: int, body: Callable[[], bytes]) -> Iterator[None]:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body())

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, port), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log_path: pathlib.Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PrometheusStartError(f"prometheus exited with {process.returncode}:\n"
                                       f"{log_path.read_text(errors='replace')}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise PrometheusStartError(f"prometheus not ready within {READY_TIMEOUT_S} s:\n"
                               f"{log_path.read_text(errors='replace')}")


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def fleet_openmetrics(hosts: int, gpus: int, at: Sequence[float], spread_s: float = 0.0) -> Iterator[str]:
    """OpenMetrics text for ``hosts`` agents with ``gpus`` GPUs and one rank per GPU,
    sampled at each time of ``at``: the series the cluster view reads, nothing else.
    ``spread_s``: node i is sampled ``spread_s * i / hosts`` later than ``at`` says (a
    scrape interval: Prometheus spreads its targets' scrapes over it).

    Node i's GPU utilization is ``i % 100`` percent (GPU 0 idle when i % 7 == 0, so
    a row's min differs from its mean), so a test can check any row.
    """
    def family(name: str, kind: str, series: Iterator[tuple[int, str, float]]) -> Iterator[str]:
        yield f"# TYPE {name} {kind}\n"
        for i, labels, value in series:
            for t in times[i]:
                yield f"{name}{{{labels}}} {value} {t:.3f}\n"

    nodes = [node_name(i) for i in range(hosts)]
    times = [[t + spread_s * i / hosts for t in at] for i in range(hosts)]

    def per_host(value: float) -> Iterator[tuple[int, str, float]]:
        return ((i, f'hostname="{n}"', value) for i, n in enumerate(nodes))

    def per_gpu(value: Callable[[int, int], float]) -> Iterator[tuple[int, str, float]]:
        for i, n in enumerate(nodes):
            for g in range(gpus):
                yield i, f'hostname="{n}",gpu="{g}",uuid="GPU-{i}-{g}"', value(i, g)

    def per_rank(value: float, extra: str = "") -> Iterator[tuple[int, str, float]]:
        for i, n in enumerate(nodes):
            for g in range(gpus):
                yield i, f'hostname="{n}",pid="{1000 + g}",rank="{i * gpus + g}",local_rank="{g}"{extra}', value

    def utilization(i: int, g: int) -> float:
        return 0.0 if g == 0 and i % 7 == 0 else (i % 100) / 100

    yield "# TYPE tuiprof_snapshot_timestamp_seconds gauge\n"  # its value is the sample's time
    for i, n in enumerate(nodes):
        for t in times[i]:
            yield f'tuiprof_snapshot_timestamp_seconds{{hostname="{n}"}} {t:.3f} {t:.3f}\n'
    yield from family("tuiprof_cpu_usage_ratio", "gauge",
                      ((i, f'hostname="{n}",mode="idle"', 0.75) for i, n in enumerate(nodes)))
    yield from family("tuiprof_memory_used_bytes", "gauge", per_host(64 * 2**30))
    yield from family("tuiprof_memory_total_bytes", "gauge", per_host(256 * 2**30))
    yield from family("tuiprof_gpu_info", "gauge", per_gpu(lambda i, g: 1))
    yield from family("tuiprof_gpu_utilization_ratio", "gauge", per_gpu(utilization))
    yield from family("tuiprof_gpu_sm_active_ratio", "gauge", per_gpu(lambda i, g: 0.5 * utilization(i, g)))
    yield from family("tuiprof_gpu_power_watts", "gauge", per_gpu(lambda i, g: 300.0))
    yield from family("tuiprof_gpu_memory_used_bytes", "gauge", per_gpu(lambda i, g: 40 * 2**30))
    yield from family("tuiprof_gpu_memory_total_bytes", "gauge", per_gpu(lambda i, g: 80 * 2**30))
    yield from family("tuiprof_rank_info", "gauge", per_rank(1, ',job_id="4242",state="running"'))
    yield from family("tuiprof_rank_step_time_seconds", "gauge", per_rank(0.5))
    yield from family("tuiprof_rank_nccl_busbw_bytes_per_second", "gauge", per_rank(2e11, ',op="AllReduce"'))
    yield from family("tuiprof_hang_status", "gauge",
                      ((i, f'hostname="{n}",level="{level}"', float(level == "ok"))
                       for i, n in enumerate(nodes) for level in ("ok", "suspect", "hung")))
    yield "# EOF\n"


def backfill(storage: pathlib.Path, text: Iterator[str], work: pathlib.Path) -> None:
    """Write ``text`` (OpenMetrics) into TSDB blocks under ``storage`` with promtool."""
    assert PROMTOOL is not None, "promtool not installed (apt package prometheus)"
    source = work / "fleet.om.txt"
    with open(source, "w") as file:
        file.writelines(text)
    storage.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(storage)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from openmetrics failed:\n{result.stdout}{result.stderr}")
    source.unlink()
