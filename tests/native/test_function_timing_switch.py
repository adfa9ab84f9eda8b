"""Function timing switched at run time (issue 30 item 1): a real Python job under `tuiprof run`, a real
agentd, SetFunctionTiming starting and stopping the timing of a function of an imported module, the
counts against the job's own; and the timed calls as host events of a timeline dump."""

from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from native.support import tuiprof_run
from testkit.agents import RunningAgent, running_agent
from testkit.traces import run_cli

WORKLIB = textwrap.dedent("""
    import time

    def work():
        time.sleep(0.001)
""")

# Marks itself a rank (a step starts the hook: its segment appears), then calls worklib.work as many
# times as each line of stdin says and answers with its own count and clock.
JOB = textwrap.dedent("""
    import ctypes, json, os, sys, time
    import worklib
    original = worklib.work
    ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        begin = time.time_ns()
        for _ in range(int(line)):
            worklib.work()
        print(json.dumps({"calls": int(line), "begin_ns": begin, "end_ns": time.time_ns(),
                          "original": worklib.work is original}), flush=True)
""")


@pytest.fixture
def job(tmp_path: pathlib.Path, cleanup_segments: list[int]) -> Iterator[subprocess.Popen[str]]:
    (tmp_path / "worklib.py").write_text(WORKLIB)
    (tmp_path / "job.py").write_text(JOB)
    process = tuiprof_run(sys.executable, str(tmp_path / "job.py"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          cwd=str(tmp_path), env={"TUIPROF_TIME_FUNCTIONS_DEFAULTS": "0", "PYTHONPATH": ""})
    cleanup_segments.append(process.pid)
    assert json.loads(process.stdout.readline())["pid"] == process.pid
    try:
        yield process
    finally:
        process.communicate("", timeout=30)


@pytest.fixture
def agent(tmp_path: pathlib.Path) -> Iterator[RunningAgent]:
    with running_agent(tmp_path) as running:
        yield running


def channel_to(agent: RunningAgent) -> grpc.Channel:
    """A plain channel to the agent, taking snapshots as large as other tests' ranks on this host make them."""
    return grpc.insecure_channel(f"127.0.0.1:{agent.port}", options=[("grpc.max_receive_message_length", 64 << 20)])


def call(job: subprocess.Popen[str], times: int) -> dict:
    """The job calls worklib.work ``times`` times; its own account of it."""
    job.stdin.write(f"{times}\n")
    job.stdin.flush()
    return json.loads(job.stdout.readline())


def rank_when(stub: pb_grpc.AgentStub, pid: int, condition, timeout: float = 20.0) -> pb.RankStats:
    """The rank ``pid`` in the first snapshot where ``condition(rank)`` holds."""
    deadline = time.monotonic() + timeout
    last = None
    for snapshot in stub.Watch(pb.WatchRequest(), timeout=timeout):
        last = next((r for r in snapshot.ranks if r.pid == pid), None)
        if last is not None and condition(last):
            return last
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"rank {pid} never matched; last seen: {last}")


def timed(rank: pb.RankStats) -> dict[str, int]:
    return {f.name: f.calls_total for f in rank.functions}


def test_a_function_is_started_then_stopped_in_a_running_rank_through_the_agent(agent, job):
    with channel_to(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        rank_when(stub, job.pid, lambda rank: True)
        call(job, 5)  # not timed yet

        outcome = stub.SetFunctionTiming(pb.SetFunctionTimingRequest(
            pid=job.pid, start=["worklib@work", "worklib@no_such_function"]), timeout=30)
        assert outcome.acknowledged, outcome
        assert list(outcome.problems) == ["cannot time worklib:no_such_function: worklib has no attribute "
                                          "'no_such_function'"]
        assert call(job, 7)["calls"] == 7
        assert not call(job, 11)["original"]  # the wrapper is in place (Python 3.11)
        rank = rank_when(stub, job.pid, lambda r: timed(r).get("worklib:work") == 7 + 11)
        assert rank.function_request.serial == outcome.serial and rank.function_request.acknowledged

        stopped = stub.SetFunctionTiming(pb.SetFunctionTimingRequest(pid=job.pid, stop=["worklib:work"]), timeout=30)
        assert stopped.acknowledged and not stopped.problems, stopped
        assert call(job, 4)["original"]  # the module's attribute is the function again: no more counted
        rank_when(stub, job.pid, lambda r: "worklib:work" not in timed(r)
                  and r.function_request.serial == stopped.serial)

        again = stub.SetFunctionTiming(pb.SetFunctionTimingRequest(pid=job.pid, start=["worklib:work"]), timeout=30)
        assert again.acknowledged and not again.problems
        call(job, 3)
        # only the calls since it started again: the 4 made while it was stopped were not counted
        rank_when(stub, job.pid, lambda r: timed(r).get("worklib:work") == 3)


def test_unknown_pid_and_empty_requests_are_refused_with_the_reason(agent, job):
    with channel_to(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.SetFunctionTiming(pb.SetFunctionTimingRequest(pid=1, start=["m@f"]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert "pid 1 is not a live rank on this host" in refused.value.details()
        with pytest.raises(grpc.RpcError) as empty:
            stub.SetFunctionTiming(pb.SetFunctionTimingRequest(pid=job.pid), timeout=10)
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_timeline_dump_holds_the_timed_calls_as_host_events(agent, job, tmp_path):
    with channel_to(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        rank_when(stub, job.pid, lambda rank: True)
        assert stub.SetFunctionTiming(pb.SetFunctionTimingRequest(pid=job.pid, start=["worklib@work"]),
                                      timeout=30).acknowledged
        own = call(job, 6)
        rank_when(stub, job.pid, lambda r: timed(r).get("worklib:work") == 6)
    result = run_cli("trace", agent.address.target, "--kind", "timeline", "--last-events", "100",
                     "--pids", str(job.pid), "--output", str(tmp_path / "out"), "--fetch", "all", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    [target] = json.loads(result.stdout)["hosts"][0]["targets"]
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    calls = [e for e in trace["traceEvents"] if e.get("cat") == "python_function"]
    assert [e["name"] for e in calls] == ["worklib:work"] * 6
    base = trace["baseTimeNanoseconds"]
    for event in calls:  # inside the span the job measured around its calls, each at least its 1 ms sleep
        start_ns, end_ns = base + event["ts"] * 1000, base + (event["ts"] + event["dur"]) * 1000
        assert own["begin_ns"] - 1e4 <= start_ns and end_ns <= own["end_ns"] + 1e4, (event, own)
        assert event["dur"] >= 1000 and event["tid"] == 0
    starts = [e["ts"] for e in calls]
    assert starts == sorted(starts) and all(b - a >= 1000 for a, b in itertools.pairwise(starts))
    assert trace["tuiprof"]["functions"]["recent_calls_kept"] == 32
