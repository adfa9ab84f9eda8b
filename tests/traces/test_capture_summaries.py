"""Trace analysis where the traces are: a real agentd summarises real PyTorch (CPU, gloo) ranks' traces on its
node; `tuiprof trace` reduces the summaries, leaves the files there unless asked, fetches the stragglers or
everything (--merge), and a caller who may not read a file gets no summary of it."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil

import pytest

from agentd.auth import Caller
from agentd.kineto.registry import Registry
from agentd.traces.capture import WRITTEN, Capture, Target
from agentd.traces.service import CaptureService
from testkit.traces import run_cli, trainers, wait_registered
from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_summary import summarize, summary_json

pytestmark = pytest.mark.slow
# The trainers poll every 1 s (see kineto_env); 1 s poll + 2 s pickup + 1 s warmup, plus slack for a loaded machine.
START_DELAY_MS = "6000"
SLOW_RANK = 1
CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"


@pytest.fixture(scope="module")
def three_ranks(agent, socket_dir):
    """Three gloo ranks polling the agent; rank 1 sleeps before each all-reduce, so the others wait for it."""
    os.environ["TRAINER_SLOW_RANK"] = str(SLOW_RANK)
    try:
        with trainers(socket_dir, [0, 1, 2]) as processes:
            del os.environ["TRAINER_SLOW_RANK"]
            for process in processes:
                wait_registered(agent, process.pid)
            yield processes
    finally:
        os.environ.pop("TRAINER_SLOW_RANK", None)


def trace(agent, processes, output: pathlib.Path, *extra: str) -> dict:
    result = run_cli("trace", agent.address.target, "--duration-ms", "2000",
                     "--pids", ",".join(str(p.pid) for p in processes), "--output", str(output),
                     "--start-delay-ms", START_DELAY_MS, "--json", *extra)
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


def assert_same(got, expected, where="summary"):
    """Equal, floats to 1e-9 relative (the agent counts on each file's own clock, the merge on the shared one)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-6), where
    else:
        assert got == expected, where


def test_merge_fetches_everything_and_the_agents_summary_equals_the_fetched_files(agent, three_ranks, tmp_path):
    doc = trace(agent, three_ranks, tmp_path, "--merge")
    [host] = doc["hosts"]
    targets = sorted(host["targets"], key=lambda t: t["rank"])
    assert [t["rank"] for t in targets] == [0, 1, 2] and all(t["local"] for t in targets)
    assert pathlib.Path(doc["merged"]["path"]).is_file() and doc["merged"]["linked_collectives"] > 0
    # The same figures from the fetched files, computed here by the console's own merge.
    merged = merge_traces([TraceInput(pathlib.Path(t["local"]), host["host"], t["rank"], t["pid"]) for t in targets],
                          tmp_path / "again.json.gz", workers=1)
    expected = summary_json(summarize(merged.ranks))
    got = doc["summary"]
    for rank in got["ranks"] + expected["ranks"]:
        rank.pop("file")  # the agent's names the file on its node, the merge's the fetched copy
    assert got["collectives_compared"] > 0
    assert_same(got, expected)
    assert doc["without_summary"] == []


def test_files_stay_on_the_node_unless_asked_and_fetch_stragglers_takes_only_those(agent, three_ranks, tmp_path):
    stays = tmp_path / "stays"
    doc = trace(agent, three_ranks, stays)
    assert not stays.exists(), "the console fetched files nobody asked for"
    assert doc["output"] is None and doc["merged"] is None
    [host] = doc["hosts"]
    assert all(t["state"] == "written" and t["local"] is None for t in host["targets"])
    assert sorted(r["rank"] for r in doc["summary"]["ranks"]) == [0, 1, 2]
    # The others waited for the slow rank: the summary points at it, and at one typical rank.
    assert doc["stragglers"][0]["rank"] == SLOW_RANK, doc["stragglers"]
    assert len(doc["stragglers"]) == 2 and doc["stragglers"][1]["why"] == "a typical rank to compare with"

    fetched_dir = tmp_path / "stragglers"
    doc = trace(agent, three_ranks, fetched_dir, "--fetch", "stragglers")
    picked = {s["rank"] for s in doc["stragglers"]}
    assert SLOW_RANK in picked and len(picked) == 2
    [host] = doc["hosts"]
    fetched = {t["rank"]: pathlib.Path(t["local"]) for t in host["targets"] if t["local"]}
    assert fetched.keys() == picked
    # Exactly those files were fetched, nothing else, whole (the agent's own copy is byte for byte the same).
    on_disk = sorted(p for p in fetched_dir.rglob("*") if p.is_file())
    assert on_disk == sorted(fetched.values())
    for target in host["targets"]:
        if target["local"]:
            original = agent.trace_dir / target["file"]
            assert pathlib.Path(target["local"]).read_bytes() == original.read_bytes()
    # tuiprof analyze works on the fetched subset.
    analyzed = run_cli("analyze", *map(str, fetched.values()), "--output", str(tmp_path / "subset.json.gz"), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert sorted(r["rank"] for r in json.loads(analyzed.stdout)["summary"]["ranks"]) == sorted(picked)


def test_text_lists_each_file_with_its_host_and_path(agent, three_ranks, tmp_path):
    result = run_cli("trace", agent.address.target, "--duration-ms", "2000",
                     "--pids", ",".join(str(p.pid) for p in three_ranks), "--output", str(tmp_path / "out"),
                     "--start-delay-ms", START_DELAY_MS)
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    listed = [line for line in lines if line.startswith("  rank ") and f": {agent.address}:" in line]
    assert len(listed) == 3 and all(line.split(f"{agent.address}:")[1].startswith(f"{os.getuid()}/")  # the trainers' user's folder
                                   for line in listed), lines
    assert lines[lines.index("stragglers:") + 1].startswith(f"  rank {SLOW_RANK} on {agent.address}: the others waited")


@pytest.fixture
def service_with_a_written_file(tmp_path):
    """A real CaptureService whose capture wrote one real Kineto trace into uid 4242's folder of its trace dir."""
    (tmp_path / "traces").mkdir()
    service = CaptureService(tmp_path / "traces", "node-a", Registry())
    service.trace_dir.prepare()
    folder = service.trace_dir.user_folder(4242)
    path = tmp_path / "traces" / folder / "rank0.pt.trace.json.gz"
    shutil.copy(CORPUS / "hta_nccl_rank0.json.gz", path)
    os.chown(path, 4242, 4242)
    capture = Capture("c1", service.trace_dir, [Target(1234, 0, f"{folder}/{path.name}", WRITTEN)], None, 0.0)
    return service, capture


async def _summarised_reply(service: CaptureService, capture: Capture, caller: Caller):
    reply = service._reply(capture, caller)
    while not reply.done:
        await asyncio.sleep(0.05)
        reply = service._reply(capture, caller)
    return reply


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the trace file to another uid")
async def test_a_caller_who_may_not_read_the_file_gets_no_summary_of_it(service_with_a_written_file):
    service, capture = service_with_a_written_file
    # Asked first by another local user: done at once, the file never summarised (nor read) for them.
    other = await _summarised_reply(service, capture, Caller.local(4343))
    assert other.done and not other.targets[0].HasField("summary")
    await asyncio.sleep(0.2)
    assert capture.summaries == {}
    owner = await _summarised_reply(service, capture, Caller.local(4242))
    [target] = owner.targets
    assert target.HasField("summary") and target.summary.result_json and not target.summary.error
    assert json.loads(target.summary.result_json)["summary"]["rank"] == 0
    assert {t.op for t in target.summary.collectives}  # with start and end times per call
    other = await _summarised_reply(service, capture, Caller.local(4343))
    assert not other.targets[0].HasField("summary")
    unidentified = await _summarised_reply(service, capture, Caller.unidentified("no peer uid"))
    assert not unidentified.targets[0].HasField("summary")
    assert (await _summarised_reply(service, capture, Caller.token_holder())).targets[0].summary.result_json
