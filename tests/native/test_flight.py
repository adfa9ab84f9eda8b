"""Flight Recorder progress: the startup hook's publisher (driven here by a scripted
recorder; the real one is exercised end to end by tests/hangs/test_gloo_hang.py) and
the agent's reading of the file it writes."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from agentd.collectors.rank_flight import NO_FLIGHT, NO_GROUPS, FlightProgress
from agentd.proto import tuiprof_agent_pb2 as pb

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "tuiprof_native" / "startup"))
import tuiprof_flight  # noqa: E402  (a top-level module in the job's Python)

ENTRY = {"pg_id": 0, "collective_seq_id": 5, "profiling_name": "gloo:all_reduce", "time_created_ns": 1000,
         "is_p2p": False}


class Recorder:
    """What torch._C._distributed_c10d's Flight Recorder dumps return, scripted; counts entry reads."""

    def __init__(self) -> None:
        self.status = {"0": (4, 4)}
        self.entries = [dict(ENTRY, collective_seq_id=s) for s in (4, 5)]
        self.full_dumps = 0

    def __call__(self, collectives: bool, only_active: bool) -> bytes:
        assert not collectives, "entries are read through read_entries"
        return json.dumps({"pg_status": {
            pg: {"last_enqueued_collective": str(e), "last_completed_collective": str(c),
                 "last_started_collective": "-1"} for pg, (e, c) in self.status.items()}}).encode()

    def read_entries(self) -> list[dict]:
        self.full_dumps += 1
        return self.entries


def publisher_of(recorder: Recorder, writes: list, clock: list[float]) -> tuiprof_flight.FlightPublisher:
    return tuiprof_flight.FlightPublisher(recorder, recorder.read_entries, "/x.flight",
                                          lambda path, text: writes.append(json.loads(text)), clock=lambda: clock[0])


def recent(*seqs: int) -> list[dict]:
    return [{"pg": "0", "seq": seq, "enqueued_ns": 1000} for seq in seqs]


def test_publisher_names_stalled_collectives_once_and_writes_only_changes():
    recorder, writes, clock = Recorder(), [], [100.0]
    publisher = publisher_of(recorder, writes, clock)
    publisher.poll()  # the first reading: the newest arrivals come with it
    assert writes == [{"groups": [{"id": "0", "last_enqueued": 4, "last_completed": 4}], "active": [],
                       "recent": recent(4, 5)}]
    publisher.poll()
    assert len(writes) == 1  # nothing changed, nothing written
    recorder.status = {"0": (5, 4)}
    publisher.poll()  # just enqueued, within a second of the last arrivals read: not read again
    clock[0] += tuiprof_flight.ENTRIES_AFTER_S - 0.5
    publisher.poll()  # still, but not long enough to pay for the entries
    assert recorder.full_dumps == 1 and writes[-1]["active"] == []
    clock[0] += 0.5
    publisher.poll()  # stalled: the entries name it, once
    clock[0] += 5
    publisher.poll()
    assert recorder.full_dumps == 2
    assert writes[-1]["active"] == [{"pg": "0", "seq": 5, "op": "gloo:all_reduce", "enqueued_ns": 1000}]
    recorder.status = {"0": (5, 5)}
    publisher.poll()
    assert writes[-1] == {"groups": [{"id": "0", "last_enqueued": 5, "last_completed": 5}], "active": [],
                          "recent": recent(4, 5)}


def test_arrivals_are_read_at_most_once_a_second_while_collectives_move():
    recorder, writes, clock = Recorder(), [], [100.0]
    publisher = publisher_of(recorder, writes, clock)
    recorder.entries = [dict(ENTRY, collective_seq_id=s, time_created_ns=s * 10) for s in range(1, 301)]
    for step in range(10):  # five seconds of polls, counters moving at every one
        recorder.status = {"0": (step + 1, step)}
        publisher.poll()
        clock[0] += tuiprof_flight.POLL_S
    assert recorder.full_dumps == 5
    assert [a["seq"] for a in writes[-1]["recent"]] == list(range(300 - tuiprof_flight.RECENT_PER_GROUP + 1, 301))
    assert writes[-1]["recent"][-1] == {"pg": "0", "seq": 300, "enqueued_ns": 3000}
    publisher.poll()
    publisher.poll()  # counters still: nothing read
    assert recorder.full_dumps == 5


def test_an_older_completion_recorded_last_does_not_hide_newer_ones():
    """Gloo's worker threads record "last completed" in whatever order they get to it: a rank that
    finished 119 and 120 and launched 121 can report 118 for good. Once stalled, the entries say
    what is still active; everything before the oldest of them has completed."""
    recorder, writes, clock = Recorder(), [], [100.0]
    recorder.status = {"0": (121, 118)}
    # As PyTorch 2.13's recorder gives gloo's entries: all "scheduled", the completed ones "retired".
    recorder.entries = [dict(ENTRY, collective_seq_id=seq, state="scheduled", retired=seq < 121)
                        for seq in (119, 120, 121)]
    publisher = publisher_of(recorder, writes, clock)
    publisher.poll()
    assert writes[-1]["groups"] == [{"id": "0", "last_enqueued": 121, "last_completed": 118}]  # not stalled yet
    clock[0] += tuiprof_flight.ENTRIES_AFTER_S
    publisher.poll()
    assert writes[-1] == {"groups": [{"id": "0", "last_enqueued": 121, "last_completed": 120}],
                          "active": [{"pg": "0", "seq": 121, "op": "gloo:all_reduce", "enqueued_ns": 1000}],
                          "recent": recent(119, 120, 121)}
    recorder.entries = recorder.entries[2:]
    recorder.status = {"0": (121, 120)}  # the recorder's own counter catches up: nothing new to say
    publisher.poll()
    clock[0] += tuiprof_flight.ENTRIES_AFTER_S
    publisher.poll()
    assert writes[-1]["groups"] == [{"id": "0", "last_enqueued": 121, "last_completed": 120}]
    # the stuck rank: it never launched 121, and its every entry is retired, yet it says 118
    recorder.status = {"0": (120, 118)}
    recorder.entries = [dict(ENTRY, collective_seq_id=seq, state="scheduled", retired=True) for seq in (119, 120)]
    publisher.poll()
    clock[0] += tuiprof_flight.ENTRIES_AFTER_S
    publisher.poll()
    assert writes[-1] == {"groups": [{"id": "0", "last_enqueued": 120, "last_completed": 120}], "active": [],
                          "recent": recent(119, 120)}


def test_agent_reads_groups_and_in_flight_collectives():
    text = json.dumps({"groups": [{"id": "0", "last_enqueued": 121, "last_completed": 120}],
                       "active": [{"pg": "0", "seq": 121, "op": "gloo:all_reduce", "enqueued_ns": 1_000_000_000}]})
    stats = pb.RankStats()
    FlightProgress().fill(text, stats, now_ns=31_000_000_000)
    assert [(g.id, g.last_enqueued, g.last_completed) for g in stats.process_groups] == [("0", 121, 120)]
    (op,) = stats.inflight
    assert (op.kind, op.op, op.comm_hash, op.sequence) == ("fr", "gloo:all_reduce", "pg0", 121)
    assert op.age_seconds == pytest.approx(30.0)


def test_no_file_or_a_malformed_one_is_unavailable_with_the_reason():
    stats = pb.RankStats()
    FlightProgress().fill("", stats, now_ns=0)
    assert stats.unavailable["process_groups"] == NO_FLIGHT
    stats = pb.RankStats()
    FlightProgress().fill('{"groups": [], "active": []}', stats, now_ns=0)  # an NCCL-only job: its groups are elsewhere
    assert stats.unavailable["process_groups"] == NO_GROUPS
    stats = pb.RankStats()
    FlightProgress().fill('{"groups": [{"id": "0"}]}', stats, now_ns=0)
    assert "malformed" in stats.unavailable["process_groups"] and "last_enqueued" in stats.unavailable["process_groups"]
    assert not stats.process_groups


def test_the_same_text_gives_its_arrivals_once_and_its_figures_every_interval():
    text = json.dumps({"groups": [{"id": "0", "last_enqueued": 5, "last_completed": 4}],
                       "active": [{"pg": "0", "seq": 5, "op": "gloo:broadcast", "enqueued_ns": 1_000_000_000}],
                       "recent": [{"pg": "0", "seq": 5, "enqueued_ns": 1_000_000_000}]})
    progress = FlightProgress()
    readings = []
    for now_s in (2, 3):
        stats = pb.RankStats()
        readings.append((progress.fill(text, stats, now_ns=now_s * 1_000_000_000), stats))
    (first_arrivals, first), (second_arrivals, second) = readings
    assert first_arrivals == [("pg0", 5, 1_000_000_000, True)] and second_arrivals == []
    assert first.process_groups == second.process_groups and len(second.process_groups) == 1
    assert [op.age_seconds for op in first.inflight] == [pytest.approx(1.0)]
    assert [op.age_seconds for op in second.inflight] == [pytest.approx(2.0)]
