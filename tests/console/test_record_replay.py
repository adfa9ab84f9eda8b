"""`tuiprof record` against a real agent, `tuiprof replay` of what it wrote, and their bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from testkit.agents import running_agent
from tuiprof.client.sources import ReplaySource
from tuiprof.model import record
from tuiprof.model.events import InfoReceived, SnapshotReceived
from tuiprof.tui.app import TuiprofApp


def tuiprof(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    return subprocess.run([sys.executable, "-m", "tuiprof.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.slow
async def test_record_a_real_agent_then_replay_it_in_the_console(tmp_path) -> None:
    out = tmp_path / "session.ndjson"
    with running_agent(tmp_path, host="127.0.0.2", interval_ms=200) as agent:
        result = tuiprof("record", str(out), agent.address.target, "--duration", "2.5")
    assert result.returncode == 0, result.stderr
    events = list(record.read(out))
    assert isinstance(events[0], InfoReceived) and events[0].host == agent.address.target
    snapshots = [e for e in events if isinstance(e, SnapshotReceived)]
    assert len(snapshots) >= 3  # 2.5 s at 200 ms, minus connecting on a busy machine
    sequences = [e.message.sequence for e in snapshots]
    assert sequences == sorted(sequences)

    app = TuiprofApp(ReplaySource(events, speed=0))
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(250):
            await pilot.pause(0.02)
            if app.cluster.host(agent.address.target).message == snapshots[-1].message:
                break
        state = app.cluster.host(agent.address.target)
        assert state.message == snapshots[-1].message
        assert len(app.cluster.history(agent.address.target).numbers("memory")) == len(snapshots)
        assert app.title == time.strftime("replay %H:%M:%S UTC", time.gmtime(snapshots[-1].at))


def test_replay_refuses_a_file_that_is_not_a_recording(tmp_path) -> None:
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"t": 1, "host": "a", "event": "snapshot", "snapshot": {"cpu": 3}}\n')
    result = tuiprof("replay", str(bad))
    assert result.returncode == 2
    assert f"{bad}:1: not a tuiprof recording line" in result.stderr and "Traceback" not in result.stderr
    result = tuiprof("replay", str(tmp_path / "missing.ndjson"))
    assert result.returncode == 2 and "cannot open recording" in result.stderr


def test_record_and_console_bad_input(tmp_path) -> None:
    result = tuiprof("record", str(tmp_path / "x.ndjson"), "127.0.0.1", "--duration", "-1")
    assert result.returncode == 2 and "--duration -1.0: expected a positive number" in result.stderr
    result = tuiprof("connect", "127.0.0.1", "--interval", "-2")
    assert result.returncode == 2 and "--interval -2.0" in result.stderr
    result = tuiprof("connect", "127.0.0.1")  # stdout is a pipe here, not a terminal
    assert result.returncode == 2 and "stdout is not a terminal" in result.stderr


def test_a_recording_from_before_the_vocabularies_were_enums_replays_with_its_words():
    """Issue 26 turned hang levels, rank states, trace target states and slowdown causes from strings
    into enums under the same field names: a recording made before holds the words."""
    old = ('{"t": 1.0, "host": "n1:1779", "event": "snapshot", "snapshot": {"hostname": "n1", '
           '"ranks": [{"pid": 7, "state": "disk-sleep"}], "hang": {"level": "hung", "ranks": '
           '[{"pid": 7, "level": "hung"}]}, "slowdowns": [{"job_id": "j", "slow": true, "cause": "gpu_slower"}]}}')
    event = record.decode(old)
    assert isinstance(event, SnapshotReceived)
    message = event.message
    assert message.ranks[0].state == pb.RANK_STATE_DISK_SLEEP and message.hang.level == pb.HANG_LEVEL_HUNG
    assert message.hang.ranks[0].level == pb.HANG_LEVEL_HUNG
    assert message.slowdowns[0].cause == pb.SLOWDOWN_CAUSE_GPU_SLOWER
    assert record.decode(record.encode(event)).message == message  # written with the value names, read back
    assert '"HANG_LEVEL_HUNG"' in record.encode(event)


def test_a_word_no_vocabulary_has_is_a_bad_recording_line():
    line = '{"t": 1.0, "host": "n1", "event": "snapshot", "snapshot": {"hang": {"level": "frozen"}}}'
    with pytest.raises(ValueError, match="frozen"):
        record.decode(line)
