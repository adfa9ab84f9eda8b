"""What the cluster view asks Prometheus: the hosts it covers, and one record per figure of a row.

Each figure of a cluster row is one PromQL instant query aggregated ``by (hostname)`` on the
server, so the console reads one number per host and figure whatever the number of GPUs and
ranks behind it. ``FIGURES`` holds one ``Figure`` per query: its PromQL, the series the
recording rules of docs/prometheus/tuiprof-rules.yml keep it in, the ``HostSummary`` field it
fills, and which reason stands for it when a host lacks it.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tuiprof.errors import BadInputError
from tuiprof.model.messages import HangLevel


class BadPatternError(BadInputError):
    """A ``--match`` that is not a regular expression."""


# ---------------------------------------------------------------- which hosts


def promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostSelection:
    """The hosts a view covers: every host with series, those matching ``pattern``, or the
    ``expected`` nodes (a SLURM job's, a host list), which are reported even without series.

    Nodes match the ``hostname`` label exactly or as the first part of a dotted name
    (SLURM's ``n1`` is the agent's ``n1.cluster.example``).
    """

    expected: tuple[str, ...] = ()
    pattern: str | None = None

    @classmethod
    def matching(cls, pattern: str) -> HostSelection:
        """Hosts whose whole ``hostname`` matches ``pattern`` (RE2 syntax, as Prometheus reads it)."""
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadPatternError(f"--match {pattern!r} is not a regular expression: {exc}; "
                                  "give one such as 'gpu-node-0[0-9]+'") from None
        return cls(pattern=pattern)

    def matcher(self) -> str:
        """The ``hostname`` label matcher selecting these hosts ("" for every host)."""
        if self.pattern is not None:
            return f"hostname=~{promql_string(self.pattern)}"
        if self.expected:
            names = "|".join(re.escape(name) for name in self.expected)
            return f"hostname=~{promql_string(f'(?:{names})(?:[.].*)?')}"
        return ""

    def node_of(self, hostname: str) -> str:
        """The expected node a ``hostname`` label stands for (itself when not expected)."""
        node = self._nodes.get(hostname)
        if node is None:  # asked for every host at every refresh: worked out once per name
            node = self._nodes[hostname] = self._work_out_node(hostname)
        return node

    def _work_out_node(self, hostname: str) -> str:
        if hostname in self._expected_set or not self.expected or is_ip_address(hostname):
            return hostname
        short = hostname.split(".", 1)[0]
        return short if short in self._expected_set else hostname

    @functools.cached_property
    def _expected_set(self) -> frozenset[str]:
        return frozenset(self.expected)

    @functools.cached_property
    def _nodes(self) -> dict[str, str]:
        return {}


# ---------------------------------------------------------------- the PromQL pieces


def _selector(metric: str, *matchers: str) -> str:
    selected = ",".join(m for m in matchers if m)
    return f"{metric}{{{selected}}}" if selected else metric


def _series(metric: str, hosts: HostSelection, *matchers: str) -> str:
    return _selector(metric, hosts.matcher(), *matchers)


def _per_host(metric: str, hosts: HostSelection, *matchers: str) -> str:
    """One series per host: the agent's figure, however many jobs scrape it."""
    return f"max by (hostname) ({_series(metric, hosts, *matchers)})"


def _per_gpu(metric: str, hosts: HostSelection) -> str:
    """One series per (host, GPU): a GPU scraped by two jobs is counted once."""
    return f"max by (hostname, gpu) ({_series(metric, hosts)})"


def _per_rank(metric: str, hosts: HostSelection) -> str:
    """One series per (host, process): a rank scraped by two jobs is counted once."""
    return f"max by (hostname, pid) ({_series(metric, hosts)})"


def _complete_sum(metric: str, hosts: HostSelection) -> str:
    """The per-host sum, only where every GPU of the host has the figure."""
    per_gpu = _per_gpu(metric, hosts)
    return (f"sum by (hostname) ({per_gpu}) and on (hostname) "
            f"(count by (hostname) ({per_gpu}) == count by (hostname) ({_per_gpu('tuiprof_gpu_info', hosts)}))")


# ---------------------------------------------------------------- the figures


class WhyMissing(enum.Enum):
    """Which reason stands for a figure a host lacks (the row's builder words each per host)."""

    HOST = "host"
    """The host collector's: its own reason when it is down, else not exported."""
    GPU = "gpu"
    """A GPU figure: not exported where the host has GPUs, else why it has none."""
    GPU_SUM = "gpu_sum"
    """A sum over the GPUs: not every GPU has it where the host has GPUs, else why it has none."""
    BUSBW = "busbw"
    """The NCCL bus bandwidth: no collectives seen where the host has ranks, else why it has none."""
    STEP = "step"
    """A rank figure: not exported where the host has ranks, else why it has none."""


@dataclass(frozen=True)
class Figure:
    """One figure of a cluster row, as Prometheus gives it: one answer per ``hostname``."""

    name: str
    """The column's name (``column_queries``' key)."""
    query: Callable[[HostSelection], str]
    """The PromQL aggregating the agents' raw series of the selected hosts."""
    recorded: str | None = None
    """The series the recording rules keep the figure in (None: never recorded)."""
    fills: str | None = None
    """The ``HostSummary`` field it fills (None: the row reads it otherwise)."""
    why_missing: WhyMissing | None = None
    """Which reason stands for it when a host lacks it (None: not a figure of the summary's)."""
    count: bool = False
    """A count (read as an int), else a number (a float)."""


IDLE = 'mode="idle"'

FIGURES: dict[str, Figure] = {figure.name: figure for figure in (
    Figure("sampled_at", lambda hosts: _per_host("tuiprof_snapshot_timestamp_seconds", hosts),
           recorded="hostname:tuiprof_snapshot_timestamp_seconds:max"),
    Figure("cpu_percent", lambda hosts: f"100 * (1 - {_per_host('tuiprof_cpu_usage_ratio', hosts, IDLE)})",
           recorded="hostname:tuiprof_cpu_busy:percent", fills="cpu_percent", why_missing=WhyMissing.HOST),
    Figure("memory_used_bytes", lambda hosts: _per_host("tuiprof_memory_used_bytes", hosts),
           recorded="hostname:tuiprof_memory_used_bytes:max", fills="memory_used_bytes",
           why_missing=WhyMissing.HOST),
    Figure("memory_total_bytes", lambda hosts: _per_host("tuiprof_memory_total_bytes", hosts),
           recorded="hostname:tuiprof_memory_total_bytes:max", why_missing=WhyMissing.HOST),
    Figure("gpu_count", lambda hosts: f"count by (hostname) ({_per_gpu('tuiprof_gpu_info', hosts)})",
           recorded="hostname:tuiprof_gpus:count", fills="gpu_count", why_missing=WhyMissing.GPU, count=True),
    Figure("gpu_util_mean",
           lambda hosts: f"100 * avg by (hostname) ({_per_gpu('tuiprof_gpu_utilization_ratio', hosts)})",
           recorded="hostname:tuiprof_gpu_utilization:avg_percent", fills="gpu_util_mean",
           why_missing=WhyMissing.GPU),
    Figure("gpu_util_min",
           lambda hosts: f"100 * min by (hostname) ({_per_gpu('tuiprof_gpu_utilization_ratio', hosts)})",
           recorded="hostname:tuiprof_gpu_utilization:min_percent", fills="gpu_util_min",
           why_missing=WhyMissing.GPU),
    Figure("sm_active_mean",
           lambda hosts: f"100 * avg by (hostname) ({_per_gpu('tuiprof_gpu_sm_active_ratio', hosts)})",
           recorded="hostname:tuiprof_gpu_sm_active:avg_percent", fills="sm_active_mean",
           why_missing=WhyMissing.GPU),
    Figure("sm_active_min",
           lambda hosts: f"100 * min by (hostname) ({_per_gpu('tuiprof_gpu_sm_active_ratio', hosts)})",
           recorded="hostname:tuiprof_gpu_sm_active:min_percent", fills="sm_active_min",
           why_missing=WhyMissing.GPU),
    Figure("power_watts", lambda hosts: _complete_sum("tuiprof_gpu_power_watts", hosts),
           recorded="hostname:tuiprof_gpu_power_watts:sum", fills="power_watts", why_missing=WhyMissing.GPU_SUM),
    Figure("gpu_memory_used_bytes", lambda hosts: _complete_sum("tuiprof_gpu_memory_used_bytes", hosts),
           recorded="hostname:tuiprof_gpu_memory_used_bytes:sum", fills="gpu_memory_used_bytes",
           why_missing=WhyMissing.GPU_SUM),
    Figure("gpu_memory_total_bytes", lambda hosts: _complete_sum("tuiprof_gpu_memory_total_bytes", hosts),
           recorded="hostname:tuiprof_gpu_memory_total_bytes:sum", fills="gpu_memory_total_bytes",
           why_missing=WhyMissing.GPU_SUM),
    Figure("rank_count", lambda hosts: f"count by (hostname) ({_per_rank('tuiprof_rank_info', hosts)})",
           recorded="hostname:tuiprof_ranks:count", count=True),
    Figure("nccl_busbw_bytes_per_s",
           lambda hosts: f"avg by (hostname) ({_series('tuiprof_rank_nccl_busbw_bytes_per_second', hosts)})",
           recorded="hostname:tuiprof_rank_nccl_busbw_bytes_per_second:avg", fills="nccl_busbw_bytes_per_s",
           why_missing=WhyMissing.BUSBW),
    Figure("step_time_seconds",
           lambda hosts: f"quantile by (hostname) (0.5, {_per_rank('tuiprof_rank_step_time_seconds', hosts)})",
           recorded="hostname:tuiprof_rank_step_time_seconds:median", fills="step_time_seconds",
           why_missing=WhyMissing.STEP),
    Figure("hang", lambda hosts: f"max by (hostname, level) ({_series('tuiprof_hang_status', hosts)} == 1)",
           fills="hang_level"),
    Figure("collectors_down",
           lambda hosts: f"max by (hostname, collector, reason) ({_series('tuiprof_collector_up', hosts)} == 0)",
           recorded="hostname_collector:tuiprof_collector_up:down"),
)}
"""Every column of the cluster view, in the order they are asked. ``hang`` carries its answer in
the ``level`` label, ``collectors_down`` in ``collector`` and ``reason``; the others are numbers.

The recording rules' expressions are these queries (a test keeps them equal). Where the rules are
loaded the console reads their series, one per host (and one per collector that is down),
instead of aggregating every GPU's, rank's and collector's series at each refresh. Every figure
of a row is recorded, with the row's time (``sampled_at``): the rules record them in one group,
so a row's figures and its time come from one evaluation (the raw snapshot time is up to an
evaluation interval newer than the figures recorded)."""

ROW_FIGURES = tuple(figure for figure in FIGURES.values() if figure.why_missing is not None)
"""The figures a row's summary is built from (each has a reason for when a host lacks it)."""


def column_queries(selection: HostSelection, recorded: bool = False) -> dict[str, str]:
    """The PromQL of every column, by name: each answers one number per ``hostname``
    (``hang`` and ``collectors_down`` carry their answer in a label); ``recorded``: read
    the recording rules' series where there are some."""
    return {figure.name: _series(figure.recorded, selection) if recorded and figure.recorded
            else figure.query(selection) for figure in FIGURES.values()}


RULES_PROBE = f"count({FIGURES['sampled_at'].recorded})"
"""Answers a sample where the recording rules are loaded: those that record the rows' time (an
older rules file without that series counts as not loaded, its rows would have no time)."""
SERVER_TIME = "vector(time())"
"""The server's clock, asked before a refresh's columns (evaluated at one moment of it)."""
SCRAPE_FAILURES = "max by (instance, job) (up == 0)"
"""Targets Prometheus cannot scrape now: why an expected host has no series."""


# ---------------------------------------------------------------- hangs


HANG_SHOWN = (HangLevel.SUSPECT, HangLevel.HUNG)
"""The levels the cluster view's banner reports."""


HANG_HOSTS_NAMED = 64
"""Up to this many troubled hosts are named in the hang query; past that (a whole job hung)
the view's own host matcher is cheaper for the server than a regex of every name."""


def hang_query(selection: HostSelection, hostnames: Collection[str]) -> str:
    """The hung or suspect ranks of these hosts and since when the hosts are so, in one answer:
    a sample with a ``level`` label is one process's verdict (``tuiprof_rank_hang_status``), a
    sample without one is its host's ``tuiprof_hang_since_timestamp_seconds``."""
    if len(hostnames) <= HANG_HOSTS_NAMED:
        hosts = f"hostname=~{promql_string('|'.join(re.escape(name) for name in hostnames))}"
    else:
        hosts = selection.matcher()
    levels = f"level=~{promql_string('|'.join(HANG_SHOWN))}"
    return (f"max by (hostname, pid, rank, level) ({_selector('tuiprof_rank_hang_status', hosts, levels)} == 1) "
            f"or max by (hostname) ({_selector('tuiprof_hang_since_timestamp_seconds', hosts)})")


SLOW_JOBS_SHOWN = 5
"""The costliest slow jobs the fleet view names (the banner's)."""


def slow_jobs_query(selection: HostSelection) -> str:
    """The slow jobs of these hosts in one answer: a sample labelled ``kind="verdict"`` is a job's
    verdict and cause (``tuiprof_job_slow``), the others the costliest rank's cost per step of the
    ``SLOW_JOBS_SHOWN`` costliest slow jobs."""
    hosts = selection.matcher()
    slow = f"{_selector('tuiprof_job_slow', hosts)} == 1"
    cost = f"max by (job_id) ({_selector('tuiprof_rank_slowdown_cost_seconds', hosts)})"
    verdicts = f'label_replace(max by (job_id, cause) ({slow}), "kind", "verdict", "job_id", ".*")'
    return f"topk({SLOW_JOBS_SHOWN}, {cost} and on (job_id) ({slow})) or {verdicts}"
