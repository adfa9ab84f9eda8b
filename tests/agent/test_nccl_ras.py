"""NCCL RAS in the hang verdict (issue 29 item 8): the parser on real answers, the client end to end.

The answers are NCCL 2.28.9's, recorded on an H200 (tests/agent/data/nccl_ras/README.md says which
are captured and which were rebuilt from that run's report). ``ReplayServer`` serves them over TCP
as RAS does: one answer line per handshake command, the report on STATUS, then it closes.
"""

from __future__ import annotations

import os
import pathlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agentd.hang import nccl_ras, ras_reader

DATA = pathlib.Path(__file__).parent / "data" / "nccl_ras"


def status_body(name: str) -> bytes:
    """The report part of a recorded conversation (after the handshake answers)."""
    received = (DATA / f"{name}.received").read_bytes()
    lines = received.split(b"\n")
    handshake = sum(1 for line in lines[:3] if line in (b"OK",) or line.startswith(b"SERVER PROTOCOL"))
    return b"\n".join(lines[handshake:])


class ReplayServer:
    """A listener on 127.0.0.1 that answers the RAS handshake and then sends ``body``."""

    def __init__(self, body: bytes, json_format: bool = True, greeting: bytes = b"SERVER PROTOCOL 2\n",
                 silent: bool = False) -> None:
        self.body, self.json_format, self.greeting, self.silent = body, json_format, greeting, silent
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.commands: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # closed by the test without a client (a listener the agent did not ask)
            return
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                self.commands.append(line)
                if self.silent:
                    continue
                if line.startswith(b"CLIENT PROTOCOL"):
                    conn.sendall(self.greeting)
                elif line.startswith(b"TIMEOUT"):
                    conn.sendall(b"OK\n")
                elif line.startswith(b"SET FORMAT"):  # NCCL before 2.28.7 knows no formats
                    conn.sendall(b"OK\n" if self.json_format else b"ERROR: Unknown command SET FORMAT json\n")
                elif line == b"STATUS\n":
                    conn.sendall(self.body)
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[type[ReplayServer]]:
    servers: list[ReplayServer] = []

    class Tracked(ReplayServer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            servers.append(self)

    yield Tracked
    for server in servers:
        server.close()


def read(server: ReplayServer) -> ras_reader.RasReading:
    """What the agent reads from ``server`` for a job whose only rank is this test process."""
    return ras_reader.read_ras(server.address, os.getuid(), {os.getpid()})


# ------------------------------------------------------------------ the parser on the recorded answers

def test_real_one_rank_json_answer_parses() -> None:
    report = nccl_ras.parse_json(status_body("one-rank-json"))
    assert report.nccl_version == "2.28.9" and report.answer_format == "json"
    (communicator,) = report.communicators
    assert communicator.comm_hash == "0x3e443b5a8be50535" and communicator.size == 1
    assert communicator.pids == {504} and not communicator.splits and communicator.missing == 0
    assert nccl_ras.evidence(report, {504}) == [
        "NCCL RAS (2.28.9, json): collective counts agree across the 1 ranks of this job's 1 communicator(s) "
        "(8be50535: no collective launched): no rank is behind in launching"]


def test_json_answer_names_the_rank_behind() -> None:
    report = nccl_ras.parse_json(status_body("two-rank-json"))
    assert nccl_ras.evidence(report, {514}) == [
        "NCCL RAS (2.28.9, json):",
        "communicator 16d6c3a6 (2 ranks): AllReduce counts differ: rank 0 launched 12, behind: rank 1 at 11 "
        "(1 behind at most)"]


def test_json_answer_about_other_processes_says_so() -> None:
    report = nccl_ras.parse_json(status_body("two-rank-json"))
    assert nccl_ras.evidence(report, {99}) == [
        "NCCL RAS (2.28.9, json): none of its 1 communicators has a rank of this job on this host"]


def test_real_text_answer_parses_and_never_claims_agreement() -> None:
    report = nccl_ras.parse_text(status_body("one-rank-text"))
    assert report.nccl_version == "2.28.9" and report.communicators == ()
    assert nccl_ras.evidence(report, {504})[0].startswith(
        "NCCL RAS (2.28.9, text): no mismatched or incomplete communicator")


def test_text_mismatch_block_parses() -> None:
    report = nccl_ras.parse_text(status_body("two-rank-text"))
    (communicator,) = report.communicators
    assert communicator.comm_hash == "0425112616d6c3a6"
    assert communicator.splits == (nccl_ras.CountSplit("AllReduce", (
        nccl_ras.CountGroup(12, 1, (0,)), nccl_ras.CountGroup(11, 1, (1,)))),)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{\"nccl_version\": 3}", '"nccl_version" is not a short printable string'),
    (b"{\"nccl_version\": \"2.28.9\", \"communicators\": [", "not JSON"),
    (b"[]", "the answer is not a JSON object"),
])
def test_garbled_json_is_refused_with_its_reason(body: bytes, reason: str) -> None:
    with pytest.raises(nccl_ras.RasAnswerError, match=reason):
        nccl_ras.parse_json(body)


def test_forged_counts_are_refused() -> None:
    body = status_body("two-rank-json").replace(b'"AllReduce": 12', b'"AllReduce": -12')
    with pytest.raises(nccl_ras.RasAnswerError, match="rank 0's 'AllReduce' count is not a count"):
        nccl_ras.parse_json(body)


# ------------------------------------------------------------------ the client end to end

def test_client_speaks_nccl_protocol_and_reads_json(serve: type[ReplayServer]) -> None:
    server = serve(status_body("two-rank-json"))
    reading = read(server)
    assert reading.unavailable == "" and reading.report is not None
    assert reading.report.communicators[0].splits[0].groups[1] == nccl_ras.CountGroup(11, 1, (1,))
    sent = b"".join(server.commands)
    assert sent == (DATA / "one-rank-json.sent").read_bytes()  # the bytes the real RAS was sent
    assert str(os.getpid()) in reading.listener


def test_client_falls_back_to_text_before_nccl_2_28_7(serve: type[ReplayServer]) -> None:
    reading = read(serve(status_body("two-rank-text"), json_format=False))
    assert reading.report is not None and reading.report.answer_format == "text"
    assert reading.report.communicators[0].splits[0].kind == "AllReduce"


def test_refused_connection_says_no_nccl_job() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = probe.getsockname()[:2]  # bound, never listening: refused
    reading = ras_reader.read_ras(address, os.getuid(), {os.getpid()})
    assert reading.report is None
    assert reading.unavailable == (f"nothing listens on 127.0.0.1:{address[1]} (no NCCL >= 2.24 job on this host, "
                                   "or NCCL_RAS_ENABLE=0)")


def test_silent_listener_times_out(serve: type[ReplayServer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ras_reader, "READ_DEADLINE_S", 0.3)
    reading = read(serve(b"", silent=True))
    assert reading.unavailable == "no complete answer within 0.3 s"


def test_oversized_answer_is_cut(serve: type[ReplayServer]) -> None:
    reading = read(serve(b"{" + b" " * (nccl_ras.MAX_ANSWER_BYTES + 1)))
    assert reading.unavailable == "its answer ran over 8 MiB: not read further"


def test_garbled_answer_is_named(serve: type[ReplayServer]) -> None:
    reading = read(serve(status_body("two-rank-json")[:200]))
    assert reading.unavailable.startswith("its json answer did not parse: not JSON")


def test_other_protocol_is_not_nccl(serve: type[ReplayServer]) -> None:
    reading = read(serve(b"", greeting=b"HTTP/1.1 400 Bad Request\n"))
    assert reading.unavailable == "the listener is not NCCL RAS: it greeted with 'HTTP/1.1 400 Bad Request\\n'"


def test_listener_that_is_not_a_rank_is_not_asked(serve: type[ReplayServer]) -> None:
    server = serve(status_body("two-rank-json"))
    reading = ras_reader.read_ras(server.address, os.getuid(), {1})
    assert reading.report is None and "not by a NCCL rank of this job: not asked, not believed" in reading.unavailable
    server.listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        server.listener.accept()  # nobody connected


def test_watch_reads_once_per_period() -> None:
    calls: list[ras_reader.JobKey] = []
    now = [0.0]
    done = threading.Event()

    def fake_read(job: ras_reader.JobKey, pids: frozenset[int]) -> ras_reader.RasReading:
        calls.append(job)
        done.set()
        return ras_reader.RasReading(None, "why", "")

    watch = ras_reader.RasWatch(fake_read, clock=lambda: now[0], reread_s=30)
    job = ras_reader.JobKey("j", 0)
    assert watch.reading(job, frozenset({1})) is None
    assert done.wait(5)
    assert watch.reading(job, frozenset({1})) == ras_reader.RasReading(None, "why", "")
    now[0] = 29.0
    watch.reading(job, frozenset({1}))
    assert calls == [job]


# ------------------------------------------------------------------ the hang verdict

def test_suspect_job_verdict_carries_what_ras_says(serve: type[ReplayServer]) -> None:
    from agentd.hang.detector import SUSPECT, Thresholds
    from agentd.hang.service import HangService
    from agentd.proto import tuiprof_agent_pb2 as pb

    server = serve(status_body("two-rank-json").replace(b'"pid": 514', f'"pid": {os.getpid()}'.encode()))
    service = HangService(Thresholds(1, 2), None, "node-a")
    service._ras = ras_reader.RasWatch(lambda job, pids: ras_reader.read_ras(server.address, job.uid, pids))
    service._ranks = {os.getpid(): pb.RankStats(pid=os.getpid(), rank=1, job_id="job")}
    status = pb.HangStatus(ranks=[pb.RankVerdict(pid=os.getpid(), rank=1, level=SUSPECT)],
                           explanation="suspect: rank 1: no optimizer step for 70 s")
    service._add_ras(status)  # starts the reading
    for _ in range(100):  # the reading is taken on a thread
        if service._ras.reading(ras_reader.JobKey("job", None), frozenset({os.getpid()})) is not None:
            break
        time.sleep(0.05)
    service._add_ras(status)
    assert status.explanation == (
        "suspect: rank 1: no optimizer step for 70 s. NCCL RAS (2.28.9, json): communicator 16d6c3a6 (2 ranks): "
        "AllReduce counts differ: rank 0 launched 12, behind: rank 1 at 11 (1 behind at most)")


def test_verdict_says_why_ras_is_unavailable() -> None:
    from agentd.hang.detector import HUNG, Thresholds
    from agentd.hang.service import HangService
    from agentd.proto import tuiprof_agent_pb2 as pb

    service = HangService(Thresholds(1, 2), None, "node-a")
    done = threading.Event()

    def refused(job: ras_reader.JobKey, pids: frozenset[int]) -> ras_reader.RasReading:
        done.set()
        return ras_reader.RasReading(None, "nothing listens on 127.0.0.1:28028 (no NCCL >= 2.24 job on this "
                                           "host, or NCCL_RAS_ENABLE=0)", "")

    service._ras = ras_reader.RasWatch(refused)
    service._ranks = {7: pb.RankStats(pid=7, rank=0, job_id="job")}
    status = pb.HangStatus(ranks=[pb.RankVerdict(pid=7, rank=0, level=HUNG)], explanation="hung: rank 0: x")
    service._add_ras(status)
    assert status.explanation == "hung: rank 0: x" and done.wait(5)
    service._add_ras(status)
    assert status.explanation == ("hung: rank 0: x. NCCL RAS unavailable: nothing listens on 127.0.0.1:28028 "
                                  "(no NCCL >= 2.24 job on this host, or NCCL_RAS_ENABLE=0)")
