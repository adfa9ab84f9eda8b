"""dynolog's TCP RPC on agentd (off by default): requests the real `dyno` CLI sent (tests/traces/data/dyno),
a real PyTorch trainer traced through it (into the trace dir, or to a log file of the caller's choosing, which the
trainer writes itself), both loopbacks, and the deliberate deviations (the local caller traces only their own
processes, and a log file only while the trainer acts with exactly its owner's rights)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest

from agentd import procfs
from agentd.kineto.registry import PendingConfig, Registry
from agentd.kineto.rpc import DynologRpc, client_config


def call(port: int, request: dict | bytes, host: str = "127.0.0.1") -> dict | None:
    """One request as `dyno` sends it: int32 length (little endian) + JSON; None when the agent closes silently."""
    body = request if isinstance(request, bytes) else json.dumps(request).encode()
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(struct.pack("<i", len(body)) + body)
        header = conn.recv(4)
        if not header:
            return None
        length = struct.unpack("<i", header)[0]
        data = b""
        while len(data) < length:
            data += conn.recv(length - len(data))
    return json.loads(data)


def wait_for_file(pattern: str, folder: pathlib.Path) -> pathlib.Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        written = list(folder.glob(pattern))
        if written:
            return written[0]
        time.sleep(0.2)
    raise AssertionError(f"no {pattern} under {folder}: {list(folder.rglob('*'))}")


@pytest.mark.slow
def test_dyno_style_on_demand_requests_trace_a_real_trainer_into_the_trace_dir_or_a_path_of_its_own(
        dynolog_served, tmp_path):
    agent, rpc_port, pid = dynolog_served
    assert call(rpc_port, {"fn": "getStatus"}) == {"status": 1}
    assert call(rpc_port, {"fn": "getVersion"})["version"].startswith("tuiprof-agentd")
    assert call(rpc_port, {"fn": "noSuchFn"}) is None
    assert call(rpc_port, b"not json") is None
    options = ["ACTIVITIES_DURATION_MSECS=500", "ACTIVITIES_WARMUP_PERIOD_SECS=1", "PROFILE_REPORT_INPUT_SHAPES=false"]

    def config(*lines: str) -> str:
        return "\n".join([*lines, f"PROFILE_START_TIME={int(time.time() * 1000) + 4000}", *options])

    relative = call(rpc_port, {"fn": "setKinetOnDemandRequest", "job_id": 0, "pids": [pid],
                               "config": config("ACTIVITIES_LOG_FILE=trace.json")})
    assert relative is not None and "log file 'trace.json' is relative" in relative["refused"]
    assert relative["processesMatched"] == []
    reply = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": config(), "job_id": 0,
                            "pids": [pid], "process_limit": 3})
    assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [pid],
                     "eventProfilersBusy": 0, "eventProfilersTriggered": [],
                     "processesMatched": [pid]}
    named = wait_for_file(f"dyno-*-pid{pid}_{pid}.pt.trace.json", agent.trace_dir / str(os.getuid()))
    assert any(e.get("name") == "aten::mm" for e in json.loads(named.read_text())["traceEvents"])
    # A folder of the user's own outside the trace dir: the trainer writes there itself, Kineto's _<pid> added.
    own = tmp_path / "own"
    own.mkdir()
    reply = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": config(f"ACTIVITIES_LOG_FILE={own}/t.json"),
                            "job_id": 0, "pids": [pid]})
    assert reply is not None and reply["activityProfilersTriggered"] == [pid]
    written = wait_for_file(f"t_{pid}.json", own)
    assert any(e.get("name") == "aten::mm" for e in json.loads(written.read_text())["traceEvents"])
    none = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": "", "job_id": 0, "pids": [999999]})
    assert none["processesMatched"] == [] and none["activityProfilersTriggered"] == []


DYNO_DATA = pathlib.Path(__file__).parent / "data" / "dyno"


def captured(name: str) -> bytes:
    """The JSON body a real `dyno` command sent (see data/dyno/README.md), its length prefix checked."""
    raw = (DYNO_DATA / f"{name}.bin").read_bytes()
    assert struct.unpack("<i", raw[:4])[0] == len(raw) - 4
    return raw[4:]


def with_log_file(body: bytes, log_file: pathlib.Path | str, **fields: object) -> bytes:
    """A captured gputrace request with dyno's --log-file swapped for ``log_file`` (and fields replaced)."""
    request = json.loads(body)
    request["config"] = request["config"].replace("/tmp/trace.json", str(log_file))
    return json.dumps({**request, **fields}).encode()


@pytest.fixture
def rpc(tmp_path):
    """The RPC over a registry where this process polls as job 0, as if in a container where it is pid 1234:
    the registry and the replies name it by its host pid."""
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True, pid_in_namespace=1234)
    with socket.socket() as unused:
        yield DynologRpc([unused], registry, lambda uid: tmp_path / str(uid), "v")


def pending_lines(rpc: DynologRpc) -> list[str]:
    pending = rpc.registry.entries()[0].pending
    assert pending is not None
    return pending.text.splitlines()


def test_captured_status_version_and_dcgm_calls_get_dynologs_answers(rpc):
    uid = os.getuid()
    assert rpc.answer(captured("status"), uid) == {"status": 1}
    assert rpc.answer(captured("version"), uid) == {"version": "v"}
    # As dynolog without DCGM: false, so `dyno dcgm-pause` prints it and exits 0 instead of panicking.
    assert rpc.answer(captured("dcgm-pause"), uid) == {"status": False}
    assert rpc.answer(captured("dcgm-resume"), uid) == {"status": False}
    assert rpc.answer(b'{"fn": "dcgmProfPause"}', uid) == {"status": "failed"}


def test_captured_gputrace_log_file_outside_the_trace_dir_is_handed_to_the_trainer_as_dyno_gave_it(rpc):
    # dynolog's own example, --log-file /tmp/trace.json: the trainer (this caller's) writes it itself
    reply = rpc.answer(captured("gputrace-iterations"), os.getuid())
    assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [os.getpid()], "eventProfilersBusy": 0,
                     "eventProfilersTriggered": [], "processesMatched": [os.getpid()]}
    pending = rpc.registry.entries()[0].pending
    assert pending is not None
    if os.getuid() == 0:
        assert pending.acting_as is None  # a root trainer: no rights to hold it to
    else:  # a user's trainer takes it only while it still acts exactly as its owner, as now
        program = os.stat("/proc/self/exe")
        assert pending.acting_as == procfs.Credentials(os.getuid(), os.getgid(), (program.st_dev, program.st_ino))
    # In the trainer's own file system, even from a container (pid 1234 there): nothing is copied out of it.
    assert pending_lines(rpc)[0] == "ACTIVITIES_LOG_FILE=/tmp/trace.json"


@pytest.mark.parametrize("log_file, why", [
    ("trace.json", "log file 'trace.json' is relative: give an absolute path (the trainer does not run in "
                   "dyno's working directory)"),
    ("./trace.json", "log file './trace.json' is relative"),
    ("/tmp/a\x01b.json", "log file '/tmp/a\\x01b.json' holds a control character; give a path of printable "
                          "characters"),
    ("/tmp/a\tb.json", "holds a control character"),
    ("/tmp/a\x1b[2Jb.json", "holds a control character"),
    ("/tmp/a\u2028b.json", "holds a control character"),
    ("/x/../tmp/a.json", "must be written plainly: no '..', no '.' component, no '//', no trailing '/'"),
    ("/tmp/a..json", "must be written plainly"),
    ("/tmp//a.json", "must be written plainly"),
    ("/tmp/./a.json", "must be written plainly"),
    ("/tmp/a=b.json", "must hold no '=' (Kineto reads KEY=value lines)"),
    ("/" + "a" * 1024, "at most 1024 characters"),
])
def test_a_log_file_dyno_would_not_find_where_it_says_refuses_the_request(rpc, log_file, why):
    # Control characters arrive JSON-escaped (the real dyno pastes them raw: not JSON, no reply, as dynolog).
    reply = rpc.answer(with_log_file(captured("gputrace-iterations"), log_file), os.getuid())
    assert reply is not None and reply["processesMatched"] == [] and reply["activityProfilersTriggered"] == []
    assert why in reply["refused"]
    assert rpc.registry.entries()[0].pending is None


@contextlib.contextmanager
def sleeper(*setpriv_args: str) -> Iterator[int]:
    """The pid of ``sleep`` started under ``setpriv ARGS``, once its uids are set."""
    process = subprocess.Popen(["setpriv", *setpriv_args, "--clear-groups", "--", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while pathlib.Path(f"/proc/{process.pid}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "setpriv never ran sleep"
            time.sleep(0.01)
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_trainer_acting_with_more_than_its_owners_rights_is_not_told_a_path_of_the_callers_choosing(rpc, tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start processes as another user")
    with sleeper("--reuid=65534", "--regid=65534") as plain, sleeper("--ruid=65534", "--regid=65534") as setuid_like:
        for pid in (plain, setuid_like):  # both poll as uid 65534, the real uid the kernel reports
            rpc.registry.poll(0, (pid,), pid, 65534, True)
        request = with_log_file(captured("gputrace-iterations"), "/tmp/trace.json", pids=[plain, setuid_like])
        assert rpc.answer(request, 65535) == {  # another user: neither is shown
            "activityProfilersBusy": 0, "activityProfilersTriggered": [], "eventProfilersBusy": 0,
            "eventProfilersTriggered": [], "processesMatched": []}
        reply = rpc.answer(request, 65534)
        assert reply is not None and sorted(reply["processesMatched"]) == sorted([plain, setuid_like])
        assert reply["activityProfilersTriggered"] == [plain]
        assert reply["refused"].startswith(f"pid {setuid_like} not traced: process {setuid_like} no longer acts only "
                                           "as its owner: its uids (real/effective/saved/filesystem) are 65534/0/0/0")
        assert reply["refused"].endswith("a log file outside the trace dir is written with the trainer's rights, "
                                         "which must be exactly its owner's")
        # The plain one takes its config while it still acts as it did when offered.
        delivered = rpc.registry.poll(0, (plain,), plain, 65534, True)
        assert delivered is not None and delivered.text.startswith("ACTIVITIES_LOG_FILE=/tmp/trace.json\n")
        # Inside the user's folder of the trace dir the path is the agent's choice of place: no rights asked.
        inside = with_log_file(captured("gputrace-iterations"), tmp_path / "65534" / "t.json", pids=[setuid_like])
        assert rpc.answer(inside, 65534)["activityProfilersTriggered"] == [setuid_like]


def test_a_config_naming_a_path_of_the_callers_choosing_is_withdrawn_when_the_trainers_rights_changed(rpc):
    [entry] = rpc.registry.entries()  # this process, root's
    held = procfs.credentials(entry.host_pid, entry.uid)
    assert held is not None
    rpc.registry.offer(entry, PendingConfig("ACTIVITIES_LOG_FILE=/tmp/t.json\n", acting_as=held))
    assert rpc.registry.poll(0, entry.pids, entry.host_pid, entry.uid, True, entry.pid_in_namespace) is not None
    # As if it had exec'd a set-user-ID program since: it no longer acts as the owner it was offered for.
    rpc.registry.offer(entry, PendingConfig("ACTIVITIES_LOG_FILE=/tmp/t.json\n",
                                            acting_as=dataclasses.replace(held, uid=4242)))
    assert rpc.registry.poll(0, entry.pids, entry.host_pid, entry.uid, True, entry.pid_in_namespace) is None
    assert rpc.registry.entries()[0].pending is None  # dropped, not kept for a later poll


def test_captured_gputrace_start_time_in_the_past_is_refused(rpc):
    rpc.registry.poll(42, (os.getppid(),), os.getppid(), os.getuid(), True)
    reply = rpc.answer(captured("gputrace-duration"), os.getuid())  # --profile-start-time 1790000000000
    assert reply is not None and "profile start time 1790000000000 is" in reply["refused"]
    assert "s in the past; give 0" in reply["refused"]


def test_captured_gputrace_iterations_honoured_in_the_users_folder_with_a_trace_id(rpc, tmp_path):
    log_file = tmp_path / str(os.getuid()) / "trace.json"
    reply = rpc.answer(with_log_file(captured("gputrace-iterations"), log_file), os.getuid())
    assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [os.getpid()], "eventProfilersBusy": 0,
                     "eventProfilersTriggered": [], "processesMatched": [os.getpid()]}
    lines = pending_lines(rpc)
    assert lines[:-1] == [f"ACTIVITIES_LOG_FILE={log_file}", "PROFILE_START_ITERATION=0",
                          "PROFILE_START_ITERATION_ROUNDUP=10", "ACTIVITIES_ITERATIONS=3",
                          "PROFILE_REPORT_INPUT_SHAPES=false", "PROFILE_WITH_STACK=false",
                          "PROFILE_WITH_FLOPS=false", "PROFILE_WITH_MODULES=false",
                          "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event"]
    assert lines[-1].startswith("REQUEST_TRACE_ID=") and lines[-1].removeprefix("REQUEST_TRACE_ID=").isdigit()


def test_captured_gputrace_options_all_reach_the_trainer(rpc, tmp_path):
    log_file = tmp_path / str(os.getuid()) / "sub" / "t.pt.trace.json"
    reply = rpc.answer(with_log_file(captured("gputrace-options"), log_file), os.getuid())
    assert reply is not None and reply["activityProfilersTriggered"] == [os.getpid()]
    lines = pending_lines(rpc)
    assert lines[:-1] == [f"ACTIVITIES_LOG_FILE={log_file}", "PROFILE_START_TIME=0", "ACTIVITIES_DURATION_MSECS=500",
                          "PROFILE_REPORT_INPUT_SHAPES=true", "PROFILE_PROFILE_MEMORY=true", "PROFILE_MEMORY=true",
                          "PROFILE_MEMORY_DURATION_MSECS=500", "PROFILE_WITH_STACK=true", "PROFILE_WITH_FLOPS=true",
                          "PROFILE_WITH_MODULES=true",
                          # stacks and modules come from libkineto's Python tracer: python_function must be on
                          "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event,python_function"]


def test_process_limit_counts_triggered_processes_and_the_rest_stay_matched(rpc, tmp_path):
    rpc.registry.poll(0, (os.getppid(),), os.getppid(), os.getuid(), True)
    body = with_log_file(captured("gputrace-iterations"), tmp_path / str(os.getuid()) / "t.json", process_limit=1)
    reply = rpc.answer(body, os.getuid())
    assert reply is not None and sorted(reply["processesMatched"]) == sorted([os.getpid(), os.getppid()])
    assert len(reply["activityProfilersTriggered"]) == 1


@pytest.mark.parametrize("line, named", [
    ("EVENTS_LOG_FILE=/etc/x", "agentd does not pass EVENTS_LOG_FILE on to trainers; accepted keys: "
                               "ACTIVITIES_LOG_FILE, ACTIVITIES_DURATION_MSECS"),
    ("ACTIVITIES_DURATION_MSECS=9 ACTIVITIES_LOG_FILE=/x", "must be ACTIVITIES_DURATION_MSECS=<letters"),
    ("REQUEST_TRACE_ID=a=b", "must be REQUEST_TRACE_ID=<letters"),
    ("PROFILE_START_TIME=1\x00", "must be PROFILE_START_TIME=<letters"),
    ("ACTIVITY_TYPES=" + "c" * 300, "must be ACTIVITY_TYPES=<letters"),
])
def test_a_config_line_agentd_will_not_pass_on_refuses_the_request_never_dropped(rpc, line, named):
    request = {"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=9\n" + line, "pids": [0]}
    reply = rpc.answer(json.dumps(request).encode(), os.getuid())
    assert reply is not None and reply["processesMatched"] == [] and named in reply["refused"]
    assert rpc.registry.entries()[0].pending is None


def test_without_a_log_file_agentd_names_one_in_the_users_folder():
    checked = client_config("ACTIVITIES_DURATION_MSECS=9  # a comment\n\n# only a comment", now_ms=0)
    assert checked.log_file is None and checked.lines == ["ACTIVITIES_DURATION_MSECS=9"]
    assert checked.text("/traces/0/p.json", cuda=True, trace_id="7").splitlines() == [
        "ACTIVITIES_LOG_FILE=/traces/0/p.json", "ACTIVITIES_DURATION_MSECS=9",
        "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event,gpu_user_annotation,gpu_memcpy,gpu_memset,"
        "kernel,cuda_runtime,cuda_driver", "REQUEST_TRACE_ID=7"]


def test_rpc_listens_on_both_loopbacks_and_identifies_the_caller_on_each(tmp_path):
    rpc = DynologRpc.bind(0, Registry(), lambda uid: tmp_path / str(uid), "v")
    assert sorted(sock.getsockname()[0] for sock in rpc.socks) == ["127.0.0.1", "::1"]

    async def status(host: str) -> bytes:
        reader, writer = await asyncio.open_connection(host, rpc.port)
        body = captured("status")
        writer.write(struct.pack("<i", len(body)) + body)
        answer = await reader.read()
        writer.close()
        return answer

    async def both() -> list[bytes]:
        await rpc.serve()
        try:
            return [await status("127.0.0.1"), await status("::1")]
        finally:
            rpc.close()

    # The peer uid is found for each family (no reply at all when the caller cannot be identified).
    assert asyncio.run(both()) == [struct.pack("<i", 12) + b'{"status":1}'] * 2


def test_local_user_triggers_only_their_own_processes(tmp_path):
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True)  # this (root) process polls
    folders = []

    def folder(uid: int) -> pathlib.Path:
        folders.append(uid)
        return tmp_path / str(uid)

    with socket.socket() as unused:
        rpc = DynologRpc([unused], registry, folder, "v")
        request = json.dumps({"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=5",
                              "pids": [os.getpid()], "job_id": 0}).encode()
        assert rpc.answer(request, None) is None  # the caller's socket has no known owner: refused
        other = rpc.answer(request, os.getuid() + 4242)
        assert other is not None and other["processesMatched"] == [] and other["activityProfilersTriggered"] == []
        assert folders == [] and registry.entries()[0].pending is None
        own = rpc.answer(request, os.getuid())
    assert own is not None and own["activityProfilersTriggered"] == [os.getpid()]
    assert folders == [os.getuid()]
    pending = registry.entries()[0].pending
    assert pending is not None and f"ACTIVITIES_LOG_FILE={tmp_path / str(os.getuid())}/dyno-" in pending.text
