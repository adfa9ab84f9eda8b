"""End to end with real PyTorch (CPU): trainers poll a real agentd; `tuiprof trace` captures, fetches, merges."""

from __future__ import annotations

import gzip
import json
import pathlib
import time

import pytest

from testkit.traces import run_cli, trainers, wait_registered
from testkit.agents import RunningAgent

pytestmark = pytest.mark.slow
# The trainers poll every 1 s (see kineto_env); 1 s poll + 2 s pickup + 1 s warmup, plus slack for a loaded machine.
START_DELAY_MS = "6000"


def load_json(path: pathlib.Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


@pytest.fixture(scope="module")
def single_trainer(agent: RunningAgent, socket_dir: pathlib.Path):
    with trainers(socket_dir, [None]) as processes:
        wait_registered(agent, processes[0].pid)
        yield processes[0]


def test_duration_trace_has_aten_mm_of_that_pid(agent, single_trainer, tmp_path):
    pid = single_trainer.pid
    before_ms = time.time() * 1000
    result = run_cli("trace", agent.address.target, "--duration-ms", "1000", "--pids", str(pid),
                     "--output", str(tmp_path), "--start-delay-ms", START_DELAY_MS, "--merge", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    assert doc["all_delivered"] is True
    [host] = doc["hosts"]
    [target] = host["targets"]
    assert target["pid"] == pid and target["state"] == "written"
    trace = load_json(pathlib.Path(target["local"]))
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm, "no aten::mm in the trace"
    assert {e["pid"] for e in mm} == {pid}
    # Wall clock = baseTimeNanoseconds + ts: every op lies inside the requested window.
    start_ms = doc["start_time_unix_ms"]
    assert start_ms > before_ms
    wall_ms = [(trace["baseTimeNanoseconds"] + e["ts"] * 1000) / 1e6 for e in mm]
    assert start_ms - 50 <= min(wall_ms) and max(wall_ms) <= start_ms + 1000 + 50
    merged = load_json(pathlib.Path(doc["merged"]["path"]))
    merged_mm = [e for e in merged["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(merged_mm) == len(mm)
    assert sorted((merged["baseTimeNanoseconds"] + e["ts"] * 1000) / 1e6 for e in merged_mm) == pytest.approx(
        sorted(wall_ms), abs=0.001)


def test_iterations_trace_covers_three_optimizer_steps(agent, single_trainer, tmp_path):
    result = run_cli("trace", agent.address.target, "--iterations", "3", "--pids", str(single_trainer.pid),
                     "--output", str(tmp_path), "--fetch", "all", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    [target] = doc["hosts"][0]["targets"]
    trace = load_json(pathlib.Path(target["local"]))
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")]
    assert len(steps) == 3, [e["name"] for e in steps]
    [rank] = doc["summary"]["ranks"]
    assert rank["step_time_us"] is not None and rank["step_time_us"] > 20_000  # the loop sleeps 20 ms a step


def test_unregistered_pid_matches_nothing(agent, tmp_path):
    result = run_cli("trace", agent.address.target, "--duration-ms", "500", "--pids", "999999",
                     "--output", str(tmp_path))
    assert result.returncode == 1
    assert "no processes matched" in result.stdout
    assert "999999" in result.stdout
    assert not list(tmp_path.glob("**/*.json*"))


def test_two_ranks_merge_into_one_timeline_with_linked_collectives(agent, socket_dir, tmp_path):
    with trainers(socket_dir, [0, 1]) as processes:
        for process in processes:
            wait_registered(agent, process.pid)
        pids = ",".join(str(p.pid) for p in processes)
        result = run_cli("trace", agent.address.target, "--duration-ms", "800", "--pids", pids,
                         "--output", str(tmp_path), "--start-delay-ms", START_DELAY_MS, "--merge", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    targets = doc["hosts"][0]["targets"]
    assert sorted((t["rank"], t["pid"]) for t in targets) == [(0, processes[0].pid), (1, processes[1].pid)]
    merged = load_json(pathlib.Path(doc["merged"]["path"]))  # loadable JSON
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    cpu_tracks = {pid: name for pid, name in names.items() if "CPU pid" in name}
    assert [name.rsplit(" (", 1)[0] for name in sorted(cpu_tracks.values())] == [
        f"rank 0 · {agent.address} · CPU pid {processes[0].pid}",
        f"rank 1 · {agent.address} · CPU pid {processes[1].pid}"]
    # Sorted by rank: rank 0's tracks sort before rank 1's.
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    rank0 = [pid for pid, name in names.items() if name.startswith("rank 0")]
    rank1 = [pid for pid, name in names.items() if name.startswith("rank 1")]
    assert max(order[p] for p in rank0) < min(order[p] for p in rank1)
    # Rebasing: each rank's ops fall inside the requested window on the wall clock.
    start_ms = doc["start_time_unix_ms"]
    for pid in cpu_tracks:
        mm = [e for e in events if e.get("name") == "aten::mm" and e["pid"] == pid]
        assert mm, f"no aten::mm on track {names[pid]}"
        wall = [(merged["baseTimeNanoseconds"] + e["ts"] * 1000) / 1e6 for e in mm]
        assert start_ms - 50 <= min(wall) and max(wall) <= start_ms + 800 + 50
    # The ranks' all-reduces are linked: each flow joins the two ranks, forward in time.
    flows = [e for e in events if e.get("cat") == "collective"]
    assert doc["merged"]["linked_collectives"] > 0
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    finishes = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert starts.keys() == finishes.keys()
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert start["ts"] <= finish["ts"]
        assert {names[start["pid"]].split(" ·")[0], names[finish["pid"]].split(" ·")[0]} == {"rank 0", "rank 1"}
    summary = doc["summary"]
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["collectives_compared"] == doc["merged"]["linked_collectives"]
