"""What NCCL's RAS service says about a job, parsed, and the verdict's sentences made of it.

NCCL 2.24 and later run a RAS (reliability, availability, serviceability) thread in
every process with a communicator; one of them answers on 127.0.0.1:28028 (moved by
``NCCL_RAS_ADDR``) with the job-wide picture NCCL's ``ncclras`` client prints: every
communicator, every rank's count of collectives launched per kind, the ranks that did
not answer. No dump is taken and nothing is stopped. The conversation
(``agentd.hang.ras_reader``) is a line protocol; its status answer is JSON from NCCL
2.28.7 (``SET FORMAT json``) and text before. This module is pure: bytes in, a
``RasReport`` out, and the sentences the hang verdict adds.

The answer comes from whoever listens on the port, a claim like any other a local
process makes: it is parsed strictly (sizes, types, counts bounded; anything else is a
``RasAnswerError`` naming what was wrong), and believed for nothing but the sentences.

From the **JSON** answer everything below is read. From the **text** answer (NCCL 2.24
to 2.28.6) only what its Errors and Warnings sections say: the ``MISMATCH`` blocks
("N ranks have launched up to operation K", "Rank R has launched up to operation K")
and the ``INCOMPLETE`` blocks (ranks missing); a communicator the text does not name
has no findings, so a text answer never says that counts agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 28028
PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL since 2.24
MAX_ANSWER_BYTES = 8 << 20       # a few hundred bytes a rank per communicator in JSON
MAX_COMMUNICATORS = 4096
MAX_RANKS = 1 << 20               # over every communicator of the answer
MAX_NAMED_RANKS = 8               # ranks a sentence names before it says "and N more"


class RasAnswerError(ValueError):
    """An answer that is not what NCCL's RAS sends; the message says what was wrong."""


@dataclass(frozen=True)
class CountGroup:
    """Ranks of one communicator that launched the same number of one kind of collective."""

    launched: int
    ranks: int                    # how many ranks
    named: tuple[int, ...] = ()   # which, when the answer names them (text names only outliers)


@dataclass(frozen=True)
class CountSplit:
    """One kind of collective whose counts differ across a communicator's ranks: largest count first."""

    kind: str
    groups: tuple[CountGroup, ...]


@dataclass(frozen=True)
class Communicator:
    comm_hash: str                              # as NCCL prints it: 0x..., or 16 hex digits in text
    size: int | None = None                     # ranks in the communicator (JSON only)
    pids: frozenset[int] = frozenset()          # the processes of its ranks that answered (JSON only)
    splits: tuple[CountSplit, ...] = ()
    agreed: tuple[tuple[str, int], ...] = ()    # counts every rank shares, non-zero (JSON only)
    missing: int = 0                            # ranks that gave no data
    missing_named: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()                  # missing ranks RAS considers dead (JSON only)
    errors: tuple[int, ...] = ()                # ranks with an asynchronous NCCL error (JSON only)


@dataclass(frozen=True)
class RasReport:
    answer_format: str                  # "json" or "text"
    nccl_version: str
    communicators: tuple[Communicator, ...]
    collection_s: float | None = None   # how long RAS took to gather (JSON only)
    timeouts: int = 0                   # peers RAS timed out on while gathering
    notes: tuple[str, ...] = field(default=())  # what the text answer says it could not collect


# ------------------------------------------------------------------ JSON (NCCL >= 2.28.7)

def parse_json(data: bytes) -> RasReport:
    """The status answer in NCCL's JSON form."""
    _check_size(data)
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RasAnswerError(f"not JSON: {exc}") from None
    top = _object(document, "the answer")
    version = _string(top, "nccl_version")
    listed = _list(top, "communicators")
    if len(listed) > MAX_COMMUNICATORS:
        raise RasAnswerError(f"{len(listed)} communicators, more than the {MAX_COMMUNICATORS} believed")
    total_ranks = 0
    communicators = []
    for item in listed:
        communicator, ranks = _json_communicator(_object(item, "a communicator"))
        total_ranks += ranks
        if total_ranks > MAX_RANKS:
            raise RasAnswerError(f"more than {MAX_RANKS} ranks over its communicators")
        communicators.append(communicator)
    ras = _object(top.get("ras"), '"ras"')
    collection = ras.get("collection_time_sec")
    if not isinstance(collection, (int, float)) or isinstance(collection, bool) or collection < 0:
        raise RasAnswerError('"ras.collection_time_sec" is not a number of seconds')
    return RasReport("json", version, tuple(communicators), float(collection), _count(ras, "timeouts_count"))


def _json_communicator(entry: dict[str, object]) -> tuple[Communicator, int]:
    ranks = [_object(r, "a rank") for r in _list(entry, "ranks")]
    missing = [_object(r, "a missing rank") for r in _list(entry, "missing_ranks")]
    counts: dict[str, dict[int, int]] = {}
    for rank in ranks:
        number = _count(rank, "rank")
        for kind, launched in _object(rank.get("collective_counts"), '"collective_counts"').items():
            if not isinstance(launched, int) or isinstance(launched, bool) or launched < 0:
                raise RasAnswerError(f"rank {number}'s {kind!r} count is not a count")
            counts.setdefault(_kind(kind), {})[number] = launched
    splits = tuple(_split(kind, by_rank) for kind, by_rank in counts.items() if len(set(by_rank.values())) > 1)
    agreed = tuple((kind, next(iter(by_rank.values()))) for kind, by_rank in counts.items()
                   if len(set(by_rank.values())) == 1 and next(iter(by_rank.values())) > 0)
    errors = tuple(sorted(_count(r, "rank") for r in ranks
                          if _object(r.get("status"), '"status"').get("async_error", 0) != 0))
    missing_status = [(_count(m, "rank"), _object(m.get("status"), '"status"')) for m in missing]
    communicator = Communicator(
        comm_hash=_string(entry, "hash"), size=_count(entry, "size"),
        pids=frozenset(_pid(r) for r in ranks) - {-1},
        splits=splits, agreed=agreed, missing=len(missing),
        missing_named=tuple(sorted(number for number, _ in missing_status)),
        dead=tuple(sorted(number for number, status in missing_status if status.get("considered_dead") is True)),
        errors=errors)
    return communicator, len(ranks) + len(missing)


def _split(kind: str, by_rank: dict[int, int]) -> CountSplit:
    by_count: dict[int, list[int]] = {}
    for rank, launched in by_rank.items():
        by_count.setdefault(launched, []).append(rank)
    groups = (CountGroup(launched, len(ranks), tuple(sorted(ranks)))
              for launched, ranks in sorted(by_count.items(), reverse=True))
    return CountSplit(kind, tuple(groups))


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RasAnswerError(f"{what} is not a JSON object")
    return value


def _list(entry: dict[str, object], key: str) -> list[object]:
    value = entry.get(key)
    if not isinstance(value, list):
        raise RasAnswerError(f'"{key}" is not a list')
    return value


def _string(entry: dict[str, object], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= 64 or not value.isprintable():
        raise RasAnswerError(f'"{key}" is not a short printable string')
    return value


def _count(entry: dict[str, object], key: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
        raise RasAnswerError(f'"{key}" is not a count')
    return value


def _pid(rank: dict[str, object]) -> int:
    pid = rank.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not -1 <= pid < 1 << 22:
        raise RasAnswerError('a rank\'s "pid" is not a pid')
    return pid


def _kind(name: str) -> str:
    """A collective kind as NCCL names it (``AllReduce``); anything else is refused."""
    if not re.fullmatch(r"[A-Za-z]{1,32}", name):
        raise RasAnswerError(f"{name[:40]!r} is not a collective's name")
    return name


# ------------------------------------------------------------------ text (NCCL 2.24 to 2.28.6)

_VERSION = re.compile(r"NCCL version (\S{1,64})")
_BLOCK = re.compile(r"#\d+-\d+ \(([0-9a-f]{1,16})\) (MISMATCH|INCOMPLETE|ERROR)")
_KIND = re.compile(r"  Communicator ranks have different (\w{1,32}) operation counts")
_GROUP = re.compile(r"  (\d{1,9}) ranks have (?:launched up to operation (\d{1,19})|not launched any operations)")
_ONE = re.compile(r"  Rank (\d{1,9}) has (?:launched up to operation (\d{1,19})|not launched any operations) --")
_MEMBER = re.compile(r"  Rank (\d{1,9}) --")
_MISSING = re.compile(r"  Missing communicator data from (\d{1,9}) ranks?")
_TIMEOUT = re.compile(r"  Encountered (\d{1,9}) communication timeouts? while gathering")


def parse_text(data: bytes) -> RasReport:
    """The status answer in NCCL's text form: its version, mismatches and missing ranks."""
    _check_size(data)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise RasAnswerError("the text answer is not ASCII") from None
    version = _VERSION.match(text)
    if version is None:
        raise RasAnswerError('the text answer does not start with "NCCL version"')
    blocks: dict[str, _TextBlock] = {}
    block: _TextBlock | None = None
    timeouts = 0
    for line in text.splitlines():
        if (match := _BLOCK.fullmatch(line)) is not None:
            block = blocks.setdefault(match[1], _TextBlock())
            if len(blocks) > MAX_COMMUNICATORS:
                raise RasAnswerError(f"more than {MAX_COMMUNICATORS} communicators")
        elif (match := _TIMEOUT.match(line)) is not None:
            timeouts = int(match[1])
        elif block is not None and line.startswith("  "):
            block.read(line)
        else:
            block = None
    communicators = tuple(b.communicator(comm_hash) for comm_hash, b in blocks.items())
    notes = tuple(line for line in text.splitlines() if line == "No communicator data collected!")
    return RasReport("text", version[1], communicators, None, timeouts, notes)


class _TextBlock:
    """One communicator's lines in the Errors and Warnings sections of the text answer."""

    def __init__(self) -> None:
        self.splits: list[tuple[str, list[CountGroup]]] = []
        self.missing = 0
        self.missing_named: list[int] = []
        self._in_missing = False

    def read(self, line: str) -> None:
        if (match := _KIND.match(line)) is not None:
            self.splits.append((match[1], []))
            self._in_missing = False
        elif (match := _MISSING.match(line)) is not None:
            self.missing = int(match[1])
            self._in_missing = True
        elif (match := _GROUP.match(line)) is not None and self.splits:
            self.splits[-1][1].append(CountGroup(int(match[2] or 0), int(match[1])))
        elif (match := _ONE.match(line)) is not None and self.splits:
            self.splits[-1][1].append(CountGroup(int(match[2] or 0), 1, (int(match[1]),)))
        elif (match := _MEMBER.match(line)) is not None:
            if self._in_missing:
                self.missing_named.append(int(match[1]))
            elif self.splits and self.splits[-1][1]:
                groups = self.splits[-1][1]
                last = groups[-1]
                groups[-1] = CountGroup(last.launched, last.ranks, (*last.named, int(match[1])))

    def communicator(self, comm_hash: str) -> Communicator:
        splits = tuple(CountSplit(kind, tuple(sorted(groups, key=lambda g: g.launched, reverse=True)))
                       for kind, groups in self.splits if groups)
        return Communicator(comm_hash=comm_hash, splits=splits, missing=self.missing,
                            missing_named=tuple(self.missing_named))


def _check_size(data: bytes) -> None:
    if len(data) > MAX_ANSWER_BYTES:
        raise RasAnswerError(f"the answer is over {MAX_ANSWER_BYTES >> 20} MiB")
    if not data:
        raise RasAnswerError("the answer is empty")


# ------------------------------------------------------------------ the verdict's sentences

def evidence(report: RasReport, job_pids: Iterable[int]) -> list[str]:
    """Sentences for the hang verdict: what RAS says of the communicators of the job with ``job_pids``.

    A JSON answer is narrowed to the communicators with one of ``job_pids`` among their ranks (RAS
    answers for every job of the user whose process holds the port); a text answer names no
    processes, so all its findings are given, said to be of every NCCL job of that user.
    """
    head = f"NCCL RAS ({report.nccl_version}, {report.answer_format})"
    if report.answer_format == "json":
        pids = set(job_pids)
        communicators = [c for c in report.communicators if c.pids & pids]
        if not communicators:
            return [f"{head}: none of its {len(report.communicators)} communicators has a rank of this job "
                    "on this host"]
    else:
        communicators = list(report.communicators)
    sentences = [sentence for communicator in communicators for sentence in _findings(communicator)]
    if report.timeouts:
        sentences.append(f"it timed out on {report.timeouts} peer(s) while gathering, so some ranks are missing")
    if report.answer_format == "text":
        scope = "its text form (NCCL < 2.28.7) names no processes; every NCCL job of the port's owner"
        if not sentences:
            return [f"{head}: no mismatched or incomplete communicator ({scope})", *report.notes]
        return [f"{head}, {scope}:", *sentences, *report.notes]
    if not sentences:
        return [f"{head}: {_agreement(communicators)}"]
    return [f"{head}:", *sentences]


def _findings(communicator: Communicator) -> list[str]:
    name = f"communicator {_short_hash(communicator.comm_hash)}"
    if communicator.size is not None:
        name += f" ({communicator.size} ranks)"
    found = []
    for split in communicator.splits:
        leader, *behind = split.groups
        lagging = "; ".join(f"{_ranks(group)} at {group.launched}" for group in behind)
        found.append(f"{name}: {split.kind} counts differ: {_ranks(leader)} launched {leader.launched}, "
                     f"behind: {lagging} ({leader.launched - behind[-1].launched} behind at most)")
    if communicator.missing:
        dead = f", {len(communicator.dead)} considered dead" if communicator.dead else ""
        named = (f": {_rank_list(communicator.missing_named)}"
                 if communicator.missing_named else "")
        found.append(f"{name}: {communicator.missing} rank(s) gave RAS no data{named}{dead}")
    if communicator.errors:
        found.append(f"{name}: asynchronous NCCL error on {_rank_list(communicator.errors)}")
    return found


def _agreement(communicators: Sequence[Communicator]) -> str:
    ranks = sum(c.size or 0 for c in communicators)
    counts = "; ".join(f"{_short_hash(c.comm_hash)}: " + (", ".join(f"{kind} {n}" for kind, n in c.agreed) or "no collective launched")
                       for c in communicators[:MAX_NAMED_RANKS])
    more = f" and {len(communicators) - MAX_NAMED_RANKS} more" if len(communicators) > MAX_NAMED_RANKS else ""
    return (f"collective counts agree across the {ranks} ranks of this job's {len(communicators)} "
            f"communicator(s) ({counts}{more}): no rank is behind in launching")


def _ranks(group: CountGroup) -> str:
    if group.named and len(group.named) == group.ranks:
        return _rank_list(group.named)
    return f"{group.ranks} ranks" + (f" ({_rank_list(group.named)} among them)" if group.named else "")


def _rank_list(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED_RANKS])
    more = f" and {len(ranks) - MAX_NAMED_RANKS} more" if len(ranks) > MAX_NAMED_RANKS else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def _short_hash(comm_hash: str) -> str:
    return comm_hash.removeprefix("0x")[-8:]
