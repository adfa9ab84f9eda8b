"""The agent's reading of a rank's ``.functions`` file: totals, rates between two publications, and
whatever else a local user can put at that path (junk, too much, a link, someone else's file)."""

from __future__ import annotations

import json
import os

import pytest

from agentd.collectors import rank_functions
from agentd.collectors.rank_functions import FIRST_PUBLICATION, MAX_FUNCTIONS_PER_RANK, NO_FUNCTIONS, FunctionTimings
from agentd.proto import tuiprof_agent_pb2 as pb

SECOND = 1_000_000_000


def publish(path: str, written_ns: int, *functions: tuple[str, int, int, int]) -> None:
    """What the startup hook writes, with a distinct mtime each time (the reader re-reads on change)."""
    doc = {"written_ns": written_ns,
           "functions": [{"name": n, "calls": c, "ns": ns, "max_ns": m} for n, c, ns, m in functions]}
    with open(path, "w") as f:
        f.write(json.dumps(doc))
    os.utime(path, ns=(written_ns, written_ns))


def read(timings: FunctionTimings, now_ns: int) -> pb.RankStats:
    stats = pb.RankStats()
    timings.fill(stats, now_ns, {timings.file.path})  # as if the folder's listing held the file
    return stats


def test_totals_then_rates_over_the_span_between_two_publications(tmp_path):
    segment = tmp_path / "tuiprof-0-1-00"
    segment.write_bytes(b"")
    timings = FunctionTimings(str(segment))
    assert read(timings, SECOND).unavailable["functions"] == NO_FUNCTIONS  # no file yet
    path = f"{segment}{rank_functions.FUNCTIONS_SUFFIX}"
    publish(path, 10 * SECOND, ("__main__:step", 4, 2 * SECOND, SECOND))
    (first,) = read(timings, 10 * SECOND).functions
    assert (first.name, first.calls_total, first.seconds_total, first.max_seconds) == ("__main__:step", 4, 2.0, 1.0)
    assert not first.HasField("calls_per_s") and first.unavailable["calls_per_s"] == FIRST_PUBLICATION
    publish(path, 12 * SECOND, ("__main__:step", 10, 3 * SECOND, SECOND), ("torch:autograd.backward", 1, 5, 5))
    step, backward = read(timings, 12 * SECOND).functions
    assert (step.calls_per_s, step.seconds_per_s) == (3.0, 0.5)  # 6 calls and 1 s over 2 s
    assert backward.unavailable["seconds_per_s"] == rank_functions.NEW_FUNCTION
    (step_again, _) = read(timings, 12 * SECOND + SECOND // 2).functions  # not rewritten since: same figures
    assert step_again.calls_per_s == 3.0
    stale = read(timings, 20 * SECOND).functions[0]
    assert not stale.HasField("calls_per_s") and "last published its function timings 8 s ago" in \
        stale.unavailable["calls_per_s"]


def test_junk_too_much_and_a_link_are_refused(tmp_path):
    segment = tmp_path / "tuiprof-0-1-00"
    segment.write_bytes(b"")
    timings = FunctionTimings(str(segment))
    path = f"{segment}{rank_functions.FUNCTIONS_SUFFIX}"
    for junk in ('{"written_ns": 1, "functions": [{"name": "x", "calls": -1, "ns": 0, "max_ns": 0}]}',
                 '{"written_ns": 1, "functions": {"name": "x"}}', "[" * 100_000, "\x00\xff not json"):
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(junk)
        stats = read(timings, SECOND)
        assert not stats.functions
        assert stats.unavailable["functions"].startswith("the function timings file is malformed")
    # past the reader's 96 KiB the text is cut, so it no longer parses: refused, never read whole
    publish(path, SECOND, *[(f"m:f{i}", 1, 1, 1) for i in range(4000)])
    assert os.path.getsize(path) > 96 * 1024
    assert read(timings, SECOND).unavailable["functions"].startswith("the function timings file is malformed")
    # more than a rank may have: the first 64 kept, the rest said
    publish(path, 2 * SECOND, *[(f"m:f{i}", 1, 1, 1) for i in range(MAX_FUNCTIONS_PER_RANK + 3)])
    stats = read(timings, 2 * SECOND)
    assert len(stats.functions) == MAX_FUNCTIONS_PER_RANK and "3 more functions" in stats.unavailable["functions"]
    os.unlink(path)
    secret = tmp_path / "secret"
    publish(str(secret), 3 * SECOND, ("m:secret", 1, 1, 1))
    os.symlink(secret, path)
    stats = read(FunctionTimings(str(segment)), 3 * SECOND)
    assert not stats.functions and stats.unavailable["functions"] == NO_FUNCTIONS  # the link is not followed


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_someone_elses_file_is_refused(tmp_path, caplog):
    segment = tmp_path / "tuiprof-0-1-00"
    segment.write_bytes(b"")
    path = f"{segment}{rank_functions.FUNCTIONS_SUFFIX}"
    publish(path, 4 * SECOND, ("m:theirs", 1, 1, 1))
    os.chown(path, 4242, 4242)  # another user's file at the name
    stats = read(FunctionTimings(str(segment)), 4 * SECOND)
    assert not stats.functions and stats.unavailable["functions"] == NO_FUNCTIONS
    assert "not a regular file of the segment's owner" in caplog.text


def test_a_name_is_made_printable_and_cut():
    publication = rank_functions.parse(json.dumps({"written_ns": 1, "functions": [
        {"name": "\x1b[2Jm:" + "f" * 500, "calls": 1, "ns": 2, "max_ns": 2}]}))
    (name,) = publication.totals
    assert "\x1b" not in name and len(name) == rank_functions.MAX_NAME
