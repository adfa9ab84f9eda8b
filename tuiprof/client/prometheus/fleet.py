"""One refresh of the cluster view from Prometheus: every figure's answer turned into each host's row.

The answers become the same ``HostSummary`` a gRPC snapshot gives (``model.summary``). What a row
cannot say is said: a figure the agent did not export is unavailable with the collector's own
reason where Prometheus has it (``tuiprof_collector_up``'s ``reason`` label), and a host expected
(a SLURM job's node) without series is missing with the reason (``up == 0``: Prometheus cannot
scrape it; else it is not scraped at all, or its series are not recorded yet).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agentd.address import AgentAddress
from agentd.text import printable
from tuiprof.model.summary import SlowJob
from tuiprof.client.prometheus.figures import (
    FIGURES, HANG_SHOWN, ROW_FIGURES, RULES_PROBE, SCRAPE_FAILURES, SERVER_TIME, Figure, HostSelection, WhyMissing,
    column_queries, hang_query, is_ip_address, slow_jobs_query,
)
from tuiprof.client.prometheus.http import PrometheusClient, QueryResult
from tuiprof.model.behaviour import ratio_percent
from tuiprof.model.convert import from_word
from tuiprof.model.messages import HangLevel, HangStatus, RankVerdict, SlowdownCause
from tuiprof.model.summary import HostSummary
from tuiprof.model.values import Reading, Unavailable

SETTLED_AFTER_S = 1.0
"""How far behind the server's clock one refresh's columns are evaluated. A scrape's samples carry
the time it started and become visible when it ends (a rule's, its group's evaluation time, when
that rule is done): columns evaluated at one moment this far back each see a scrape whole or not
at all, so a row's figures are those of one snapshot (unpinned, the concurrent column queries
each took the server's now, and a scrape ending between two of them mixed two snapshots in a row)."""

NOT_EXPORTED = "not in Prometheus: the agent did not export it (the host view says why)"
NOT_RECORDED_YET = ("not recorded yet: the host is new to Prometheus, and its recording rules "
                    "record it at their next evaluation")
NOT_EVERY_GPU = "not in Prometheus for every GPU of the host (a partial sum would mislead)"
NOT_SCRAPED = ("no tuiprof series in Prometheus: the agent is not scraped (add the node with "
               "`tuiprof prometheus-targets`) or reports another hostname")


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
    slow_jobs: list[SlowJob] = field(default_factory=list)
    """The costliest slow jobs, costliest first (the banner's)."""


def slow_jobs(result: QueryResult) -> list[SlowJob]:
    """``slow_jobs_query``'s answer: the jobs with a cost, costliest first, each with its cause."""
    # label values are any scrape target's text: escaped before a terminal shows them
    causes = {printable(s.metric.job_id): printable(s.metric.cause) for s in result.samples
              if s.metric.kind == "verdict"}
    costs = {printable(s.metric.job_id): float(s.value[1]) for s in result.samples if s.metric.kind != "verdict"}
    return sorted((SlowJob(job, from_word(SlowdownCause, causes.get(job, "")), cost) for job, cost in costs.items()),
                  key=lambda job: -job.cost_seconds)


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


def _levels_by_host(result: QueryResult) -> dict[str, HangLevel]:
    return {s.metric.hostname: from_word(HangLevel, s.metric.level) for s in result.samples}


def _count(text: str) -> int:
    """A count as Prometheus writes it (a float: "8")."""
    return int(float(text))


_SUMMARY_FIELDS = tuple(HostSummary.__dataclass_fields__)


@functools.lru_cache(maxsize=4096)
def _unavailable(reason: str) -> Unavailable:
    """One object per reason: ten thousand rows share a handful of them."""
    return Unavailable(reason)


class _Columns:
    """The answers of one refresh, each digested as it arrives (``take``), and the reasons for
    what is not in them."""

    def __init__(self, results: Mapping[str, QueryResult], recorded: bool) -> None:
        self.figures: dict[str, dict[str, str]] = {}
        self.hang: dict[str, HangLevel] = {}
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
        hosts per figure), each host's reasons shared with every host in the same case; each
        field of the summary is the column of the figure that fills it (``Figure.fills``), but
        ``memory_percent``, worked out of the used and total memory."""
        missing = [self._missing(host) for host in hosts]
        readings = {figure.name: self._readings(figure, hosts, [why[i] for why in missing])
                    for i, figure in enumerate(ROW_FIGURES)}
        memory = [ratio_percent(used, total)
                  for used, total in zip(readings["memory_used_bytes"], readings["memory_total_bytes"], strict=True)]
        columns: dict[str, list[Reading] | list[HangLevel]] = {**readings, "hang": [self.hang.get(host, HangLevel.UNSPECIFIED) for host in hosts]}
        fields = {figure.fills: columns[figure.name] for figure in FIGURES.values() if figure.fills}
        fields["memory_percent"] = memory
        # positional in the summary's own field order, so no column lands in another's field (keyword
        # arguments cost a fifth more at ten thousand rows)
        return [HostSummary(*row) for row in zip(*(fields[name] for name in _SUMMARY_FIELDS), strict=True)]

    def _readings(self, figure: Figure, hosts: Sequence[str], otherwise: Sequence[Unavailable]) -> list[Reading]:
        """The figure of each host, or the reason it has none."""
        figures = self.figures[figure.name]
        number = _count if figure.count else float
        return [number(text) if (text := figures.get(host)) is not None else why
                for host, why in zip(hosts, otherwise, strict=True)]

    def _missing(self, host: str) -> tuple[Unavailable, ...]:
        """Why the host lacks each of ``ROW_FIGURES`` (for the figures it has, unused)."""
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
            WhyMissing.HOST: self.gap(host, "host", NOT_EXPORTED),
            WhyMissing.GPU: _unavailable(NOT_EXPORTED) if has_gpus else self.gap(host, "gpu", "no GPUs on this host"),
            WhyMissing.GPU_SUM: (_unavailable(NOT_EVERY_GPU) if has_gpus
                                 else self.gap(host, "gpu", "no GPUs on this host")),
            WhyMissing.BUSBW: _unavailable("no NCCL collectives seen") if has_ranks else no_ranks,
            WhyMissing.STEP: _unavailable(NOT_EXPORTED) if has_ranks else no_ranks,
        }
        why = tuple(_unavailable(NOT_RECORDED_YET) if not_yet and figure.recorded
                    else reasons[figure.why_missing] for figure in ROW_FIGURES if figure.why_missing)
        if usual:
            self._usual[has_gpus, has_ranks] = why
        return why


def hang_statuses(levels: Mapping[str, HangLevel], result: QueryResult) -> dict[str, HangStatus]:
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
            RankVerdict(pid=int(labels.pid or 0), rank=rank, level=from_word(HangLevel, labels.level), explanation=""))
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
    slow = slow_jobs(await client.query(slow_jobs_query(selection), columns.evaluated_at))
    query_seconds = time.perf_counter() - started
    rows = _rows(columns, selection, previous or {})
    absent = [node for node in dict.fromkeys((*selection.expected, *also_expected)) if node not in rows]
    missing = await _why_missing(client, absent, columns.recorded) if absent else {}
    return FleetView(columns.evaluated_at, rows, missing, query_seconds, columns.recorded,
                     {selection.node_of(host): status for host, status in hangs.items()}, slow)


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
    rows.update(zip(nodes, map(HostRow, nodes, hosts, times, columns.summaries(hosts), rank_counts), strict=True))
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
        if not is_ip_address(host):
            by_short_name.setdefault(host.split(".", 1)[0], reason)
    return {node: NOT_RECORDED_YET if node in not_recorded else by_host.get(node) or by_short_name.get(node)
            or NOT_SCRAPED for node in nodes}


async def _scraped_not_recorded(client: PrometheusClient, nodes: list[str]) -> set[str]:
    """Of ``nodes`` (absent from the recorded series), those with raw series (a snapshot time):
    scraped, and recorded at the rules' next evaluation."""
    selection = HostSelection(expected=tuple(nodes))
    answer = await client.query(FIGURES["sampled_at"].query(selection))
    return {selection.node_of(sample.metric.hostname) for sample in answer.samples}
