"""What one trace file may cost the agent's summaries (issue 24 item 5): a gzip bomb and an event with
no end are refused with the reason, the buffer is joined a bounded number of times whatever the file,
and one owner's slow file does not hold up another owner's."""

from __future__ import annotations

import asyncio
import gzip
import os
import pathlib
import shutil
import threading
import zlib

import pytest

from agentd.auth import Caller
from agentd.kineto.registry import Registry
from agentd.traces.analysis import stream, summarise
from agentd.traces.capture import WRITTEN, Capture, Target
from agentd.traces.service import CaptureService

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"
HEAD = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "'
TAIL = b'", "ts": 1, "dur": 1}]}'


def gzip_bomb(path: pathlib.Path, inflated: int) -> None:
    """One event whose name is ``inflated`` bytes of 'A', gzipped as it is written (never whole in memory)."""
    piece = b"A" * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    with path.open("wb") as out:
        out.write(compressor.compress(HEAD))
        for _ in range(inflated // len(piece)):
            out.write(compressor.compress(piece))
        out.write(compressor.compress(TAIL) + compressor.flush())


def test_a_gzip_bomb_is_refused_once_it_inflates_past_the_ratio(trace_dir):
    folder = trace_dir.user_folder(os.getuid())
    gzip_bomb(trace_dir.path / folder / "bomb.json", 256 << 20)
    assert (trace_dir.path / folder / "bomb.json").stat().st_size * summarise.MAX_INFLATION_RATIO < 256 << 20
    summary = summarise.summarise_file(trace_dir, f"{folder}/bomb.json", "node-a", 1, 0)
    assert "inflated to" in summary.error and f"more than {summarise.MAX_INFLATION_RATIO} times" in summary.error
    assert not summary.result_json


def test_an_event_past_the_bound_is_refused(trace_dir):
    folder = trace_dir.user_folder(os.getuid())
    (trace_dir.path / folder / "long.json").write_bytes(HEAD + b"A" * (stream.MAX_EVENT_BYTES + (1 << 20)) + TAIL)
    summary = summarise.summarise_file(trace_dir, f"{folder}/long.json", "node-a", 1, 0)
    assert "hold no boundary between events" in summary.error, summary.error
    assert f"at most {stream.MAX_EVENT_BYTES >> 20} MiB" in summary.error


def test_a_long_event_is_joined_once_per_batch_not_once_per_piece(monkeypatch):
    """A stretch with no cut is tried again only once another batch's bytes have come: the work is linear in
    the file (a try per 1 MiB piece joined the whole growing buffer each time: quadratic)."""
    tries = []
    cut = stream._cut

    def counted(buffer: bytes):
        tries.append(len(buffer))
        return cut(buffer)

    monkeypatch.setattr(stream, "_cut", counted)
    long_event = 12 << 20
    data = HEAD + b"A" * long_event + b'", "ts": 1, "dur": 1}, {"ph": "X", "name": "b", "ts": 2, "dur": 1}]}'
    pieces = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    events = [event for batch in stream.event_batches(pieces, stream.TraceFacts()) for event in batch]
    assert [event.name for event in events] == ["A" * long_event, "b"]
    assert len(tries) <= long_event // stream.BATCH_BYTES + 1, tries
    assert sum(tries) <= 3 * long_event, tries


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give trace files to other uids")
async def test_one_owners_slow_file_does_not_hold_up_anothers(tmp_path, monkeypatch):
    (tmp_path / "traces").mkdir()
    service = CaptureService(tmp_path / "traces", "node-a", Registry())
    service.trace_dir.prepare()
    captures = []
    for uid in (4242, 4343):
        folder = service.trace_dir.user_folder(uid)
        path = tmp_path / "traces" / folder / "rank0.pt.trace.json.gz"
        shutil.copy(CORPUS / "hta_nccl_rank0.json.gz", path)
        os.chown(path, uid, uid)
        captures.append(Capture(f"c{uid}", service.trace_dir,
                                [Target(1234, 0, f"{folder}/{path.name}", WRITTEN)], None, 0.0))
    slow_started, release = threading.Event(), threading.Event()
    summarise_file = summarise.summarise_file

    def slow_for_4242(trace_dir, file, *args):
        if file.startswith("4242/"):  # as long as a huge file of theirs would take
            slow_started.set()
            release.wait(60)
        return summarise_file(trace_dir, file, *args)

    monkeypatch.setattr(summarise, "summarise_file", slow_for_4242)
    try:
        service._reply(captures[0], Caller.token_holder())
        assert await asyncio.to_thread(slow_started.wait, 30)
        for _ in range(200):  # 4343's file, asked for while 4242's is being summarised
            reply = service._reply(captures[1], Caller.token_holder())
            if reply.done:
                break
            await asyncio.sleep(0.05)
        assert reply.done and reply.targets[0].summary.result_json, reply
        assert not captures[0].summaries  # still at it
    finally:
        release.set()
    for _ in range(200):
        if service._reply(captures[0], Caller.token_holder()).done:
            break
        await asyncio.sleep(0.05)
    assert captures[0].summaries[captures[0].targets[0].file].result_json
    service.summariser.close()


def test_gzip_bomb_helper_writes_what_it_says(tmp_path):
    gzip_bomb(tmp_path / "b.json.gz", 4 << 20)
    with gzip.open(tmp_path / "b.json.gz") as inflated:
        data = inflated.read()
    assert data == HEAD + b"A" * (4 << 20) + TAIL
