"""The cluster view from Prometheus: one PromQL instant query per column, aggregated by the server.

Past about a thousand hosts the console stops holding a stream per agent and reads
the fleet from the Prometheus (or Thanos, Mimir, VictoriaMetrics) that already
scrapes the agents' ``/metrics``. Every refresh sends one instant query per figure
of a cluster row, each aggregated ``by (hostname)`` on the server (the agents'
series all carry a ``hostname`` label), so the console parses one number per host
and column, whatever the number of GPUs and ranks behind it. The answers become the
same ``HostSummary`` a gRPC snapshot gives (``model.summary``), and reach the cluster
state as ``SummaryReceived`` events, so the cluster screen cannot tell the sources
apart.

What a row cannot say is said: a host expected (a SLURM job's node) without series
is unreachable with the reason (``up == 0``: Prometheus cannot scrape it; else it
is not scraped at all); a host whose newest snapshot is older than ``stale_after_s``
is unreachable as stale, its last figures kept; a figure the agent did not export
is unavailable with the collector's own reason where Prometheus has it
(``tuiprof_collector_up``'s ``reason`` label).

The console still talks to single agents over gRPC for what is asked for: a host
drilled into is watched directly (``PrometheusSource.attend``) while its screen is
open, and traces and stacks go to the agents as in direct mode.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Self

import httpx
import msgspec

from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import Emit, HostClient, RetryNow
from tuiprof.errors import BadInputError
from tuiprof.model.behaviour import ratio_percent
from tuiprof.model.events import HostEvent, HostUnreachable, SummaryReceived
from tuiprof.model.messages import HangStatus, RankVerdict
from tuiprof.model.summary import HostSummary
from tuiprof.model.values import Reading, Unavailable

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 5.0
STALE_AFTER_S = 60.0
"""A host whose newest snapshot in Prometheus is older than this is shown stale (unreachable,
last figures kept): at the usual 15-30 s scrape interval that is two scrapes or more missed
(with the recording rules, the newest snapshot their last evaluation recorded: up to one
evaluation interval, 15 s in docs/prometheus, older than the newest scraped)."""
QUERY_TIMEOUT_S = 30.0
SETTLED_AFTER_S = 1.0
"""How far behind the server's clock one refresh's columns are evaluated. A scrape's samples carry
the time it started and become visible when it ends (a rule's, its group's evaluation time, when
that rule is done): columns evaluated at one moment this far back each see a scrape whole or not
at all, so a row's figures are those of one snapshot (unpinned, the concurrent column queries
each took the server's now, and a scrape ending between two of them mixed two snapshots in a row)."""
RANK_HOSTS_AT_ONCE = 1024
"""The NCCL/GEMM view watches at most this many hosts' agents over gRPC: one console follows
about a thousand streams in half a core (bench/console/console_fleet.md)."""

NOT_EXPORTED = "not in Prometheus: the agent did not export it (the host view says why)"
NOT_RECORDED_YET = ("not recorded yet: the host is new to Prometheus, and its recording rules "
                    "record it at their next evaluation")
NOT_EVERY_GPU = "not in Prometheus for every GPU of the host (a partial sum would mislead)"
NOT_SCRAPED = ("no tuiprof series in Prometheus: the agent is not scraped (add the node with "
               "`tuiprof prometheus-targets`) or reports another hostname")


class PrometheusError(BadInputError):
    """Prometheus could not answer; the message says why and what to do."""


class PrometheusUnreachableError(PrometheusError):
    """Nothing answered at the URL."""


class NotPrometheusError(PrometheusError):
    """Something answered, but not with Prometheus's HTTP API."""


class QueryRejectedError(PrometheusError):
    """Prometheus refused a query (a bad ``--match`` pattern, a server limit)."""


class BadPatternError(BadInputError):
    """A ``--match`` that is not a regular expression."""


# ---------------------------------------------------------------- which hosts


def promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


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
    def matching(cls, pattern: str) -> "HostSelection":
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
        if hostname in self._expected_set or not self.expected or _is_ip_address(hostname):
            return hostname
        short = hostname.split(".", 1)[0]
        return short if short in self._expected_set else hostname

    @functools.cached_property
    def _expected_set(self) -> frozenset[str]:
        return frozenset(self.expected)

    @functools.cached_property
    def _nodes(self) -> dict[str, str]:
        return {}


# ---------------------------------------------------------------- the queries


def _selector(metric: str, *matchers: str) -> str:
    selected = ",".join(m for m in matchers if m)
    return f"{metric}{{{selected}}}" if selected else metric


def _series(metric: str, selection: HostSelection, *matchers: str) -> str:
    return _selector(metric, selection.matcher(), *matchers)


def _per_gpu(metric: str, selection: HostSelection) -> str:
    """One series per (host, GPU): a GPU scraped by two jobs is counted once."""
    return f"max by (hostname, gpu) ({_series(metric, selection)})"


def _complete_sum(metric: str, selection: HostSelection) -> str:
    """The per-host sum, only where every GPU of the host has the figure."""
    per_gpu = _per_gpu(metric, selection)
    return (f"sum by (hostname) ({per_gpu}) and on (hostname) "
            f"(count by (hostname) ({per_gpu}) == count by (hostname) ({_per_gpu('tuiprof_gpu_info', selection)}))")


RECORDED: dict[str, str] = {
    "sampled_at": "hostname:tuiprof_snapshot_timestamp_seconds:max",
    "cpu_percent": "hostname:tuiprof_cpu_busy:percent",
    "memory_used_bytes": "hostname:tuiprof_memory_used_bytes:max",
    "memory_total_bytes": "hostname:tuiprof_memory_total_bytes:max",
    "gpu_count": "hostname:tuiprof_gpus:count",
    "gpu_util_mean": "hostname:tuiprof_gpu_utilization:avg_percent",
    "gpu_util_min": "hostname:tuiprof_gpu_utilization:min_percent",
    "sm_active_mean": "hostname:tuiprof_gpu_sm_active:avg_percent",
    "sm_active_min": "hostname:tuiprof_gpu_sm_active:min_percent",
    "power_watts": "hostname:tuiprof_gpu_power_watts:sum",
    "gpu_memory_used_bytes": "hostname:tuiprof_gpu_memory_used_bytes:sum",
    "gpu_memory_total_bytes": "hostname:tuiprof_gpu_memory_total_bytes:sum",
    "rank_count": "hostname:tuiprof_ranks:count",
    "nccl_busbw_bytes_per_s": "hostname:tuiprof_rank_nccl_busbw_bytes_per_second:avg",
    "step_time_seconds": "hostname:tuiprof_rank_step_time_seconds:median",
    "collectors_down": "hostname_collector:tuiprof_collector_up:down",
}
"""Columns kept as series by the recording rules of docs/prometheus/tuiprof-rules.yml (each
rule's expression is the column's query; a test keeps them equal). Where the rules are
loaded the console reads these series, one per host (and one per collector that is down),
instead of aggregating every GPU's, rank's and collector's series at each refresh. Every
column of a row's figures is here, with the row's time (``sampled_at``): the rules record
them in one group, so a row's figures and its time come from one evaluation (the raw
snapshot time is up to an evaluation interval newer than the figures recorded)."""
RULES_PROBE = f"count({RECORDED['sampled_at']})"
"""Answers a sample where the recording rules are loaded: those that record the rows' time (an
older rules file without that series counts as not loaded, its rows would have no time)."""
SERVER_TIME = "vector(time())"
"""The server's clock, asked before a refresh's columns (evaluated at one moment of it)."""


def column_queries(selection: HostSelection, recorded: bool = False) -> dict[str, str]:
    """The PromQL of every column, by name: each answers one number per ``hostname``
    (``hang`` and ``collectors_down`` carry their answer in a label); ``recorded``: read
    the recording rules' series where there are some."""
    queries = _aggregations(selection)
    if recorded:
        queries |= {column: _series(rule, selection) for column, rule in RECORDED.items()}
    return queries


def _snapshot_time(selection: HostSelection) -> str:
    """Each host's newest snapshot time as scraped (the raw series)."""
    return f"max by (hostname) ({_series('tuiprof_snapshot_timestamp_seconds', selection)})"


def _aggregations(selection: HostSelection) -> dict[str, str]:
    def per_rank(metric: str) -> str:
        return f"max by (hostname, pid) ({_series(metric, selection)})"

    idle = _series("tuiprof_cpu_usage_ratio", selection, 'mode="idle"')

    return {
        "sampled_at": _snapshot_time(selection),
        "cpu_percent": f"100 * (1 - max by (hostname) ({idle}))",
        "memory_used_bytes": f"max by (hostname) ({_series('tuiprof_memory_used_bytes', selection)})",
        "memory_total_bytes": f"max by (hostname) ({_series('tuiprof_memory_total_bytes', selection)})",
        "gpu_count": f"count by (hostname) ({_per_gpu('tuiprof_gpu_info', selection)})",
        "gpu_util_mean": f"100 * avg by (hostname) ({_per_gpu('tuiprof_gpu_utilization_ratio', selection)})",
        "gpu_util_min": f"100 * min by (hostname) ({_per_gpu('tuiprof_gpu_utilization_ratio', selection)})",
        "sm_active_mean": f"100 * avg by (hostname) ({_per_gpu('tuiprof_gpu_sm_active_ratio', selection)})",
        "sm_active_min": f"100 * min by (hostname) ({_per_gpu('tuiprof_gpu_sm_active_ratio', selection)})",
        "power_watts": _complete_sum("tuiprof_gpu_power_watts", selection),
        "gpu_memory_used_bytes": _complete_sum("tuiprof_gpu_memory_used_bytes", selection),
        "gpu_memory_total_bytes": _complete_sum("tuiprof_gpu_memory_total_bytes", selection),
        "rank_count": f"count by (hostname) ({per_rank('tuiprof_rank_info')})",
        "nccl_busbw_bytes_per_s": f"avg by (hostname) ({_series('tuiprof_rank_nccl_busbw_bytes_per_second', selection)})",
        "step_time_seconds": f"quantile by (hostname) (0.5, {per_rank('tuiprof_rank_step_time_seconds')})",
        "hang": f"max by (hostname, level) ({_series('tuiprof_hang_status', selection)} == 1)",
        "collectors_down": f"max by (hostname, collector, reason) ({_series('tuiprof_collector_up', selection)} == 0)",
    }


SCRAPE_FAILURES = "max by (instance, job) (up == 0)"
"""Targets Prometheus cannot scrape now: why an expected host has no series."""


# ---------------------------------------------------------------- the HTTP API


class _Labels(msgspec.Struct, gc=False):
    """The labels the console reads (others are skipped while decoding; absent ones are "")."""

    hostname: str = ""
    level: str = ""
    collector: str = ""
    reason: str = ""
    pid: str = ""
    rank: str = ""
    instance: str = ""
    job: str = ""


class _Sample(msgspec.Struct, gc=False):
    # gc=False: ten thousand samples an answer, kept while a refresh lasts, would otherwise
    # make Python's collector walk them again and again (3-4x the decoding time)
    metric: _Labels
    value: tuple[float, str]


class _Vector(msgspec.Struct):
    resultType: str
    result: list[_Sample]


class _Answer(msgspec.Struct):
    status: str
    data: _Vector | None = None
    errorType: str = ""
    error: str = ""


_decode_answer = msgspec.json.Decoder(_Answer).decode


@dataclass(frozen=True)
class QueryResult:
    """An instant vector: ``evaluated_at`` (the server's clock) and its samples."""

    evaluated_at: float
    samples: list[_Sample]


class PrometheusClient:
    """Instant queries against ``url`` (the server's base URL) over one HTTP connection pool."""

    def __init__(self, url: str, timeout: float = QUERY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        if not re.match(r"https?://[^/]", self.url):
            raise NotPrometheusError(f"--prometheus {url!r}: expected an http:// or https:// URL, "
                                     "such as http://prometheus:9090")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)
        self.queries_sent = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._http.aclose()

    async def query(self, promql: str, at: float | None = None) -> QueryResult:
        """One instant query (POST, so long host lists fit), evaluated ``at`` that time (the server's
        Unix time; None: its now); PrometheusError with the reason."""
        self.queries_sent += 1
        form = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        try:
            reply = await self._http.post("/api/v1/query", data=form)
        except httpx.TimeoutException:
            raise PrometheusUnreachableError(
                f"Prometheus at {self.url} did not answer within {self._http.timeout.read:g} s") from None
        except httpx.HTTPError as exc:
            raise PrometheusUnreachableError(
                f"cannot reach Prometheus at {self.url}: {exc or type(exc).__name__}; "
                "check the URL and that the server runs") from None
        try:
            answer = _decode_answer(reply.content)
        except msgspec.DecodeError:
            kind = reply.headers.get("content-type", "no content type").split(";")[0]
            raise NotPrometheusError(
                f"{self.url} is not a Prometheus HTTP API (POST /api/v1/query gave HTTP "
                f"{reply.status_code}, {kind}); give the server's base URL, such as http://prometheus:9090"
            ) from None
        if answer.status != "success" or answer.data is None:
            raise QueryRejectedError(f"Prometheus at {self.url} refused a query ({answer.errorType}): "
                                     f"{answer.error}")
        if answer.data.resultType != "vector":
            raise NotPrometheusError(f"{self.url} answered an instant query with a {answer.data.resultType}, "
                                     "not a vector; is it a Prometheus HTTP API?")
        evaluated = at if at is not None else answer.data.result[0].value[0] if answer.data.result else time.time()
        return QueryResult(evaluated, answer.data.result)

    async def check(self) -> None:
        """Raise PrometheusError unless the URL answers PromQL (before a console starts)."""
        await self.query("vector(1)")


# ---------------------------------------------------------------- answers → rows


@dataclass(frozen=True, slots=True)
class HostRow:
    """One host's figures as Prometheus has them: ``sampled_at`` is its newest snapshot's time."""

    node: str
    hostname: str
    sampled_at: float
    summary: HostSummary
    rank_count: int = 0
    """Training processes the agent reads (the NCCL/GEMM view watches hosts that have some)."""


@dataclass(frozen=True)
class FleetView:
    """One refresh: the rows of the hosts Prometheus has, and why each expected one is missing."""

    evaluated_at: float
    rows: dict[str, HostRow]
    missing: dict[str, str]
    query_seconds: float
    recorded: bool
    """Whether the rows came from the recording rules' series."""
    hangs: dict[str, HangStatus] = field(default_factory=dict)
    """The verdicts of the hosts (by node) whose level is suspect or hung (the banner's)."""


def _figures(result: QueryResult) -> dict[str, str]:
    """Each host's figure as Prometheus wrote it (NaN, 0/0 on the server, is no figure): read
    as a number only for the rows built, the hosts whose snapshot is new."""
    return {sample.metric.hostname: sample.value[1] for sample in result.samples if sample.value[1] != "NaN"}


def _collector_gaps(result: QueryResult) -> dict[str, dict[str, str]]:
    gaps: dict[str, dict[str, str]] = {}
    for sample in result.samples:
        labels = sample.metric
        gaps.setdefault(labels.hostname, {})[labels.collector] = labels.reason
    return gaps


def _levels_by_host(result: QueryResult) -> dict[str, str]:
    return {s.metric.hostname: s.metric.level for s in result.samples}


_COUNTS = frozenset({"gpu_count", "rank_count"})


def _count(text: str) -> int:
    """A count as Prometheus writes it (a float: "8")."""
    return int(float(text))


@functools.lru_cache(maxsize=4096)
def _unavailable(reason: str) -> Unavailable:
    """One object per reason: ten thousand rows share a handful of them."""
    return Unavailable(reason)


FIGURES = ("cpu_percent", "memory_used_bytes", "memory_total_bytes", "gpu_count", "gpu_util_mean", "gpu_util_min",
           "sm_active_mean", "sm_active_min", "power_watts", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
           "nccl_busbw_bytes_per_s", "step_time_seconds")
"""The columns a row's figures come from; from ``gpu_count`` on in ``HostSummary``'s field order."""
_WHY_MISSING = ("host", "host", "host", "gpu", "gpu", "gpu", "gpu", "gpu", "gpu_sum", "gpu_sum", "gpu_sum",
                "busbw", "step")
"""Which reason stands for each of ``FIGURES`` when a host lacks it."""


class _Columns:
    """The answers of one refresh, each digested as it arrives (``take``), and the reasons for
    what is not in them."""

    def __init__(self, results: Mapping[str, QueryResult], recorded: bool) -> None:
        self.figures: dict[str, dict[str, str]] = {}
        self.hang: dict[str, str] = {}
        self.gaps: dict[str, dict[str, str]] = {}
        self.evaluated_at = 0.0
        """When the server evaluated the ``sampled_at`` column (its clock)."""
        self.recorded = recorded
        self._usual: dict[tuple[bool, bool], tuple[Unavailable, ...]] = {}
        for name, result in results.items():
            self.take(name, result)

    def take(self, name: str, result: QueryResult) -> None:
        """One column's answer, by hostname: its figures (or levels, or reasons)."""
        if name == "hang":
            self.hang = _levels_by_host(result)
        elif name == "collectors_down":
            self.gaps = _collector_gaps(result)
        else:
            self.figures[name] = _figures(result)
        if name == "sampled_at":
            self.evaluated_at = result.evaluated_at

    def gap(self, host: str, collector: str, otherwise: str) -> Unavailable:
        """Why ``collector``'s figures are missing: its own reason when it is down, else ``otherwise``."""
        reasons = self.gaps.get(host)
        if reasons and collector in reasons:
            return _unavailable(reasons[collector] or f"{collector} collector unavailable")
        return _unavailable(otherwise)

    def summaries(self, hosts: Sequence[str]) -> list[HostSummary]:
        """The hosts' rows. Ten thousand a refresh: built column by column (one pass over the
        hosts per figure), each host's reasons shared with every host in the same case."""
        missing = [self._missing(host) for host in hosts]
        columns = [self._readings(column, hosts, [why[i] for why in missing]) for i, column in enumerate(FIGURES)]
        cpu, used, total, *gpus_and_ranks = columns
        memory = [ratio_percent(u, t) for u, t in zip(used, total)]
        levels = [self.hang.get(host, "") for host in hosts]
        return [HostSummary(*row) for row in zip(cpu, memory, used, *gpus_and_ranks, levels)]  # field order

    def _readings(self, column: str, hosts: Sequence[str], otherwise: Sequence[Unavailable]) -> list[Reading]:
        """The column's figure of each host, or the reason it has none."""
        figures = self.figures[column]
        number = _count if column in _COUNTS else float
        return [number(text) if (text := figures.get(host)) is not None else why
                for host, why in zip(hosts, otherwise)]

    def _missing(self, host: str) -> tuple[Unavailable, ...]:
        """Why the host lacks each of ``FIGURES`` (for the figures it has, unused)."""
        figures, gaps = self.figures, self.gaps.get(host)
        has_gpus, has_ranks = host in figures["gpu_count"], host in figures["rank_count"]
        # A host's time recorded without its CPU figure (every agent exports one): the answers
        # straddle the rules' first evaluation of the host (the columns are queried at once,
        # each seeing the rules' results recorded by then), so its figures are not yet there.
        not_yet = self.recorded and host not in figures["cpu_percent"] and not (gaps and "host" in gaps)
        usual = gaps is None and not not_yet
        if usual and (has_gpus, has_ranks) in self._usual:
            return self._usual[has_gpus, has_ranks]
        no_ranks = self.gap(host, "ranks", "no training processes seen")
        reasons = {
            "host": self.gap(host, "host", NOT_EXPORTED),
            "gpu": _unavailable(NOT_EXPORTED) if has_gpus else self.gap(host, "gpu", "no GPUs on this host"),
            "gpu_sum": _unavailable(NOT_EVERY_GPU) if has_gpus else self.gap(host, "gpu", "no GPUs on this host"),
            "busbw": _unavailable("no NCCL collectives seen") if has_ranks else no_ranks,
            "step": _unavailable(NOT_EXPORTED) if has_ranks else no_ranks,
        }
        why = tuple(_unavailable(NOT_RECORDED_YET) if not_yet and column in RECORDED else reasons[kind]
                    for column, kind in zip(FIGURES, _WHY_MISSING))
        if usual:
            self._usual[has_gpus, has_ranks] = why
        return why


# ---------------------------------------------------------------- hangs


HANG_SHOWN = ("suspect", "hung")
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


def hang_statuses(levels: Mapping[str, str], result: QueryResult) -> dict[str, HangStatus]:
    """Per hostname whose level (``levels``) is suspect or hung, its verdict from ``hang_query``'s
    answer, as a gRPC snapshot gives it but without the agent's free-text explanations
    (labels never carry free text: the host's own view has them)."""
    since: dict[str, float] = {}
    verdicts: dict[str, list[RankVerdict]] = {}
    for sample in result.samples:
        labels = sample.metric
        if not labels.level:
            since[labels.hostname] = float(sample.value[1])
            continue
        rank: Reading = int(labels.rank) if labels.rank.isdigit() else _unavailable(
            "the process has no RANK in its environment")
        verdicts.setdefault(labels.hostname, []).append(
            RankVerdict(pid=int(labels.pid or 0), rank=rank, level=labels.level, explanation=""))
    return {host: HangStatus(level, round(since.get(host, 0.0) * 1e9), "", tuple(verdicts.get(host, ())))
            for host, level in levels.items() if level in HANG_SHOWN}


async def recording_rules_loaded(client: PrometheusClient) -> bool:
    """Whether the server keeps tuiprof's recording rules (then ``fetch_fleet(recorded=True)``)."""
    return bool((await client.query(RULES_PROBE)).samples)


async def _read_columns(client: PrometheusClient, selection: HostSelection, recorded: bool) -> _Columns:
    """Every column's query at once, all evaluated at one moment (``SETTLED_AFTER_S`` before the
    server's now), each answer digested as soon as it comes, while the server still evaluates
    the others."""
    columns = _Columns({}, recorded)
    at = (await client.query(SERVER_TIME)).evaluated_at - SETTLED_AFTER_S

    async def read(name: str, promql: str) -> None:
        columns.take(name, await client.query(promql, at))

    await asyncio.gather(*(read(name, promql) for name, promql in column_queries(selection, recorded).items()))
    return columns


async def _read_columns_and_mode(client: PrometheusClient, selection: HostSelection,
                                 guess: bool) -> tuple[_Columns, bool]:
    """The columns read as if the rules were loaded (``guess``) or not, and whether they are."""
    if not guess:
        return await asyncio.gather(_read_columns(client, selection, False), recording_rules_loaded(client))
    columns = await _read_columns(client, selection, True)
    # no recorded row time means no rules (or rules without it), or no host selected yet
    return columns, bool(columns.figures["sampled_at"]) or await recording_rules_loaded(client)


async def fetch_fleet(client: PrometheusClient, selection: HostSelection, also_expected: Iterable[str] = (),
                      recorded: bool | None = None, guess: bool = True,
                      previous: Mapping[str, HostRow] | None = None) -> FleetView:
    """Every column at once; rows keyed by node (``selection.node_of``), the expected nodes
    (``selection.expected`` and ``also_expected``) without series in ``missing`` with the reason.

    ``recorded``: read the recording rules' series (True) or aggregate the raw ones (False).
    None: whichever the server has now, found out every time (rules are loaded, evaluated
    first, or removed while a console runs) with no round trip of its own when it is the
    ``guess`` (the mode last seen): recorded row times in the answer say the rules are loaded;
    else the rules probe, sent with the raw columns. Only when the guess was wrong are the columns
    read again. ``previous``: the last view's rows, kept as they are for the hosts whose
    snapshot did not change (scraped every 15 s and refreshed every 5 s, two hosts in
    three): no new row is built for them.
    """
    started = time.perf_counter()
    if recorded is None:
        columns, rules_loaded = await _read_columns_and_mode(client, selection, guess)
        if rules_loaded != guess:
            columns = await _read_columns(client, selection, rules_loaded)
    else:
        columns = await _read_columns(client, selection, recorded)
    troubled = {host: level for host, level in columns.hang.items() if level in HANG_SHOWN}
    # a healthy fleet costs no query here; a troubled one, one query over its troubled hosts
    hangs = (hang_statuses(troubled, await client.query(hang_query(selection, troubled), columns.evaluated_at))
             if troubled else {})
    query_seconds = time.perf_counter() - started
    rows = _rows(columns, selection, previous or {})
    absent = [node for node in dict.fromkeys((*selection.expected, *also_expected)) if node not in rows]
    missing = await _why_missing(client, absent, columns.recorded) if absent else {}
    return FleetView(columns.evaluated_at, rows, missing, query_seconds, columns.recorded,
                     {selection.node_of(host): status for host, status in hangs.items()})


def _rows(columns: _Columns, selection: HostSelection, previous: Mapping[str, HostRow]) -> dict[str, HostRow]:
    """Each host's row by node: the previous one where the host's snapshot is the same, else
    built from the answers."""
    rows: dict[str, HostRow] = {}
    nodes: list[str] = []
    hosts: list[str] = []
    times: list[float] = []
    node_of = selection.node_of
    for hostname, sampled in columns.figures["sampled_at"].items():
        node, sampled_at = node_of(hostname), float(sampled)
        row = previous.get(node)
        if row is not None and row.sampled_at == sampled_at and row.hostname == hostname:
            rows[node] = row
        else:
            nodes.append(node)
            hosts.append(hostname)
            times.append(sampled_at)
    ranks = columns.figures["rank_count"]
    rank_counts = [_count(text) if (text := ranks.get(host)) is not None else 0 for host in hosts]
    rows.update(zip(nodes, map(HostRow, nodes, hosts, times, columns.summaries(hosts), rank_counts)))
    return rows


async def _why_missing(client: PrometheusClient, nodes: list[str], recorded: bool) -> dict[str, str]:
    """Each node's reason: not recorded yet (``recorded``: its raw series are there, the rules
    have not evaluated them yet), Prometheus cannot scrape it (``up == 0``), or does not
    scrape it at all.

    A target is the node's when its host is the node's name, or the node's name is the
    first part of it (SLURM's ``n1``, the target's ``n1.cluster.example``).
    """
    if recorded:
        scrape_failures, not_recorded = await asyncio.gather(client.query(SCRAPE_FAILURES),
                                                             _scraped_not_recorded(client, nodes))
    else:
        scrape_failures, not_recorded = await client.query(SCRAPE_FAILURES), set()
    by_host: dict[str, str] = {}
    by_short_name: dict[str, str] = {}
    for sample in scrape_failures.samples:
        instance = sample.metric.instance
        host = AgentAddress.parse(instance).host if instance else ""
        reason = (f"Prometheus cannot scrape it (up == 0 for {instance}, job {sample.metric.job or '?'}; "
                  "its targets page says why)")
        by_host.setdefault(host, reason)
        if not _is_ip_address(host):
            by_short_name.setdefault(host.split(".", 1)[0], reason)
    return {node: NOT_RECORDED_YET if node in not_recorded else by_host.get(node) or by_short_name.get(node)
            or NOT_SCRAPED for node in nodes}


async def _scraped_not_recorded(client: PrometheusClient, nodes: list[str]) -> set[str]:
    """Of ``nodes`` (absent from the recorded series), those with raw series (a snapshot time):
    scraped, and recorded at the rules' next evaluation."""
    selection = HostSelection(expected=tuple(nodes))
    answer = await client.query(_snapshot_time(selection))
    return {selection.node_of(sample.metric.hostname) for sample in answer.samples}


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- rows → events


def stale_reason(age: float) -> str:
    return (f"stale: its newest snapshot in Prometheus is {age:.0f} s old (the agent stopped "
            "sampling, or Prometheus stopped scraping it)")


@dataclass
class FleetEvents:
    """Turns successive views into host events, each change once: a row only when its
    snapshot is new, an unreachable host only when its reason changes."""

    address_of: Callable[[str], str]
    stale_after_s: float = STALE_AFTER_S
    _sampled: dict[str, float] = field(default_factory=dict)
    _errors: dict[str, str] = field(default_factory=dict)

    def seen(self) -> list[str]:
        """Nodes seen so far: a node that vanishes later is reported missing, not forgotten."""
        return list(self._sampled)

    def forget(self, node: str) -> None:
        """Report the node afresh next time (its row was fed from elsewhere meanwhile)."""
        self._sampled.pop(node, None)
        self._errors.pop(node, None)

    def events(self, view: FleetView, skip: Iterable[str] = ()) -> list[HostEvent]:
        skipped = set(skip)
        result: list[HostEvent] = []
        for node, row in view.rows.items():
            if node in skipped:
                continue
            if self._sampled.get(node) != row.sampled_at:
                self._sampled[node] = row.sampled_at
                self._errors.pop(node, None)
                result.append(SummaryReceived(self.address_of(node), row.sampled_at, row.summary))
            age = view.evaluated_at - row.sampled_at
            if age > self.stale_after_s:
                self._unreachable(result, node, view.evaluated_at, stale_reason(age))
        for node, reason in view.missing.items():
            if node not in skipped:
                self._sampled.setdefault(node, float("nan"))  # NaN: seen, no figure (never equal)
                self._unreachable(result, node, view.evaluated_at, reason)
        return result

    def all_unreachable(self, at: float, error: str, skip: Iterable[str] = ()) -> list[HostEvent]:
        """Prometheus itself failed: every known host is unknown now, for that reason."""
        skipped = set(skip)
        result: list[HostEvent] = []
        for node in self._sampled:
            if node not in skipped:
                self._unreachable(result, node, at, error)
        return result

    def _unreachable(self, result: list[HostEvent], node: str, at: float, error: str) -> None:
        # the age in a stale reason grows every refresh: compare the kind of reason, not its text
        kind = error.split(":", 1)[0]
        if self._errors.get(node, "").split(":", 1)[0] != kind:
            result.append(HostUnreachable(self.address_of(node), at, error))
        self._errors[node] = error


# ---------------------------------------------------------------- the console's source


NO_VIEW_YET = "no answer from Prometheus yet: no host with ranks known (try again after a refresh)"
NO_RANKS = "no host in Prometheus has training processes (ranks appear once started with `tuiprof run`)"


@dataclass(frozen=True)
class RankHosts:
    """The agents asked about ranks (``addresses``) of the ``with_ranks`` hosts Prometheus shows with some."""

    addresses: list[str]
    with_ranks: int

    def cut(self) -> str:
        """What the bound left out and how to narrow the view ("" when nothing was)."""
        if len(self.addresses) == self.with_ranks:
            return ""
        return (f"the first {len(self.addresses)} of {self.with_ranks} hosts with ranks (hung or suspect "
                "first, then by name); name the job with --slurm-job or fewer hosts with --match to see the rest")


@dataclass
class PrometheusSource:
    """The console's events from Prometheus every ``refresh_s``; hosts drilled into from their agents.

    ``agent_port`` and ``options`` say how to reach an agent over gRPC (the cluster
    state is keyed by agent address, so traces and stacks find them as in direct mode).
    """

    url: str
    selection: HostSelection
    options: ConnectionOptions
    agent_port: int
    refresh_s: float = DEFAULT_REFRESH_S
    stale_after_s: float = STALE_AFTER_S
    live: bool = True
    retry: RetryNow = field(default_factory=RetryNow)
    last_view: FleetView | None = None
    _attended: dict[str, tuple[asyncio.Task[None], Callable[[], bool]]] = field(default_factory=dict)
    _emit: Emit | None = None

    def __post_init__(self) -> None:
        self._events = FleetEvents(self.address, self.stale_after_s)
        self._nodes: dict[str, str] = {}
        """Node of each agent address, and address of each node."""
        self._addresses: dict[str, str] = {}
        self._released: set[str] = set()
        """Nodes watched over gRPC until now: their next row is built afresh from Prometheus."""

    def address(self, node: str) -> str:
        address = self._addresses.get(node)
        if address is None:  # asked for every host at every refresh: made once per node
            address = self._addresses[node] = str(AgentAddress(node, self.agent_port))
            self._nodes[address] = node
        return address

    @property
    def hosts(self) -> list[str]:
        return [self.address(node) for node in self.selection.expected]

    async def run(self, emit: Emit) -> None:
        self._emit = emit
        async with PrometheusClient(self.url) as client:
            try:
                while True:
                    started = time.monotonic()
                    await self.refresh(client, emit)
                    await self.retry.sleep(max(0.0, self.refresh_s - (time.monotonic() - started)))
            finally:
                for task, _ in self._attended.values():
                    task.cancel()

    async def refresh(self, client: PrometheusClient, emit: Emit) -> None:
        """One round of queries, turned into events (a failed round makes every host unknown)."""
        self._release_closed()
        attended = [self._nodes[a] for a in self._attended]
        last = self.last_view
        previous = {} if last is None else last.rows
        if self._released:
            previous = {node: row for node, row in previous.items() if node not in self._released}
        try:
            # the rules are most likely loaded at fleet scale (they make it work): the first guess
            view = await fetch_fleet(client, self.selection, self._events.seen(),
                                     guess=True if last is None else last.recorded, previous=previous)
        except PrometheusError as exc:
            log.warning("prometheus refresh failed", extra={"url": self.url, "error": str(exc)})
            for event in self._events.all_unreachable(time.time(), str(exc), attended):
                emit(event)
            return
        self._released.clear()
        self.last_view = view
        for event in self._events.events(view, attended):
            emit(event)

    def attended(self) -> list[str]:
        """The hosts watched over gRPC now."""
        return list(self._attended)

    def hang(self, address: str) -> HangStatus | None:
        """The host's suspect or hung verdict as Prometheus has it; None when it has none, or
        when the host is watched over gRPC (its own snapshots then carry the verdict)."""
        if self.last_view is None or address in self._attended:
            return None
        return self.last_view.hangs.get(self._nodes.get(address, address))

    def rank_hosts(self) -> RankHosts | None:
        """The hosts the console asks over gRPC about their ranks (the NCCL/GEMM view, stacks):
        those with ranks in Prometheus, the hung or suspect ones first, then by name, at most
        ``RANK_HOSTS_AT_ONCE``; None before Prometheus's first answer."""
        view = self.last_view
        if view is None:
            return None
        with_ranks = sorted((node for node, row in view.rows.items() if row.rank_count > 0),
                            key=lambda node: (node not in view.hangs, node))
        return RankHosts([self.address(node) for node in with_ranks[:RANK_HOSTS_AT_ONCE]], len(with_ranks))

    def attend_ranks(self, while_: Callable[[], bool]) -> str:
        """Watch over gRPC, while ``while_()`` holds, the agents of ``rank_hosts`` (the NCCL/GEMM
        view: per-op latencies, first calls and how each figure was timed are in the agents'
        snapshots only). Says what it did."""
        chosen = self.rank_hosts()
        if chosen is None:
            return NO_VIEW_YET
        for address in chosen.addresses:
            self.attend(address, while_)
        if not chosen.addresses:
            return NO_RANKS
        text = f"the ranks of {len(chosen.addresses)} host(s), from their agents over gRPC while this view is open"
        return f"{text}: {chosen.cut()}" if chosen.cut() else text

    def attend(self, address: str, while_: Callable[[], bool]) -> None:
        """Watch this host's agent over gRPC while ``while_()`` holds (its screen is open)."""
        if address in self._attended or self._emit is None:
            return
        client = HostClient(AgentAddress.parse(address, self.agent_port), self.options, self._emit, retry=self.retry)
        self._attended[address] = (asyncio.create_task(client.run(), name=f"watch {address}"), while_)

    def _release_closed(self) -> None:
        for address, (task, while_) in list(self._attended.items()):
            if not while_():
                task.cancel()
                del self._attended[address]
                node = self._nodes.get(address, address)
                self._events.forget(node)
                self._released.add(node)
