"""``tuiprof analyze --diff A B`` on real traces: two corpus files (figures checked against sums of
their raw events) and a real two-rank PyTorch CPU job captured twice, the second time with rank 1
sleeping before each all_reduce."""

from __future__ import annotations

import gzip
import json
import pathlib
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from testkit.ports import free_port
from testkit.traces import run_cli
from tuiprof.analysis.trace_diff import diff
from tuiprof.analysis.trace_merge import TraceInput, merge_traces

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"
RANK0, RANK1 = CORPUS / "hta_nccl_rank0.json.gz", CORPUS / "hta_nccl_rank1.json.gz"
JOB = pathlib.Path(__file__).parent / "gloo_job.py"
DELAY_S = 0.2  # rank 1's sleep before each of the 4 recorded all_reduces in capture B
RECORDED_STEPS = 4


def kernel_sums(path: pathlib.Path) -> dict[str, tuple[int, float]]:
    sums: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            sums[e["name"]][0] += 1
            sums[e["name"]][1] += e["dur"]
    return {name: (count, total) for name, (count, total) in sums.items()}


def results(path: pathlib.Path, tmp_path: pathlib.Path, name: str):
    return merge_traces([TraceInput(path)], tmp_path / name, workers=1).ranks


def test_two_corpus_files_kernel_and_category_changes_are_the_raw_sums(tmp_path):
    a, b = results(RANK0, tmp_path, "a.json.gz"), results(RANK1, tmp_path, "b.json.gz")
    result = diff(a, b)
    assert result.pairing == ["one rank on each side: A's rank 0 compared with B's rank 1"]
    before, after = kernel_sums(RANK0), kernel_sums(RANK1)
    changes = sorted(((name, after.get(name, (0, 0.0))[1] - before.get(name, (0, 0.0))[1])
                      for name in before.keys() | after.keys()), key=lambda item: (-abs(item[1]), item[0]))
    assert [(t.name, t.total_us.delta) for t in result.kernels] == [
        (name, pytest.approx(delta, abs=1e-3)) for name, delta in changes[:len(result.kernels)]]
    assert len(result.kernels) == 10
    [rank] = result.ranks
    assert rank.categories["compute"].a == a[0].summary.compute_us
    assert rank.categories["compute"].b == b[0].summary.compute_us
    assert result.categories["idle"].delta == pytest.approx(b[0].summary.idle_us - a[0].summary.idle_us, abs=1e-3)
    # The NCCL kernels are the collectives: calls and time per op
    [sendrecv] = [t for t in result.collectives if "SendRecv" in t.name]
    nccl = [name for name in before if "SendRecv" in name]
    assert sendrecv.calls.a == sum(before[n][0] for n in nccl)
    assert sendrecv.total_us.b == pytest.approx(sum(after[n][1] for n in nccl if n in after), abs=1e-3)


# PyTorch's own abort at the end of a gloo job (std::terminate with no exception in flight), seen under the
# full suite's load after both ranks had stopped profiling (the job runs no code of ours). The job now leaves
# its ranks with os._exit once their traces are written (the abort came twice in a row in one run); a job
# that still aborts, earlier, is run once more.
TEARDOWN_ABORT = "terminate called without an active exception"


def capture(out: pathlib.Path, delay: float) -> pathlib.Path:
    """Run the two-rank job into ``out``; once more (from scratch) if PyTorch aborted at teardown."""
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        done = subprocess.run([sys.executable, str(JOB), str(out), "1", str(delay), str(free_port())],
                              capture_output=True, text=True, timeout=240)
        if done.returncode == 0 or TEARDOWN_ABORT not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["rank0.json", "rank1.json"]
    return out


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path_factory.mktemp("gloo")
    return capture(root / "before", 0.0), capture(root / "after", DELAY_S)


def test_a_real_job_captured_twice_names_the_slower_ranks_and_the_collective(captures):
    before, after = captures
    done = run_cli("analyze", "--diff", str(before), str(after), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["a"] == [str(before / "rank0.json"), str(before / "rank1.json")]
    result = document["diff"]
    assert result["kernels_are"] == "CPU ops (inclusive)" and result["pairing"] == []
    assert all(c["a"] is None and c["b"] is None for c in result["categories"].values())
    # Every step got slower by about the sleep, on both ranks (rank 0 waits for rank 1).
    assert {r["rank"] for r in result["ranks"]} == {0, 1}
    for rank in result["ranks"]:
        assert rank["step_time_us"]["delta"] > 0.5 * DELAY_S * 1e6, rank
    # Rank 0's all_reduce now waits for rank 1: the collective that got slower, and the largest change.
    top = result["collectives"][0]
    assert (top["rank"], top["name"]) == (0, "gloo:all_reduce")
    assert top["calls"]["a"] == top["calls"]["b"] == RECORDED_STEPS
    assert top["total_us"]["delta"] > 0.5 * RECORDED_STEPS * DELAY_S * 1e6
    assert top["mean_us"]["b"] > top["mean_us"]["a"]

    text = run_cli("analyze", "--diff", str(before), str(after))
    assert text.returncode == 0, text.stderr
    assert "job GPU time: n/a (no GPU kernel, memcpy or memset events on either side)" in text.stdout
    assert "collectives, largest change first (per rank):\n  rank 0 gloo:all_reduce: 4 → 4 calls" in text.stdout


def test_diff_usage_errors_are_one_line_and_exit_2(tmp_path):
    for args, message in (
            (["analyze", str(RANK0), "--diff", str(RANK0), str(RANK1)], "give either PATH… or --diff A B, not both"),
            (["analyze", "--diff", str(RANK0), str(RANK1), "--output", str(tmp_path)], "does not go with --diff"),
            (["analyze"], "give trace files or folders (PATH…), or --diff A B"),
            (["analyze", "--diff", str(RANK0), str(tmp_path / "missing")], "no such file or folder")):
        done = run_cli(*args)
        assert done.returncode == 2, args
        assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_traces_without_a_rank_are_named_as_such_in_the_diff():
    triton, rocm = CORPUS / "hta_triton.json.gz", CORPUS / "hta_rocm62_mi250.json.gz"  # neither has a rank
    done = run_cli("analyze", "--diff", str(triton), str(rocm))
    assert done.returncode == 0, done.stderr
    assert "None" not in done.stdout
    assert "  the trace without a rank: step time" in done.stdout


def test_the_rank_that_arrives_late_is_charged_the_wait_it_caused(captures):
    """The job's own injected delay is the truth: rank 1 sleeps DELAY_S before each recorded all_reduce."""
    before, after = captures
    slowed = json.loads(run_cli("analyze", str(after), "--json").stdout)["summary"]
    [hold, *others] = slowed["held_up"]
    assert hold["rank"] == 1 and hold["collectives"] >= RECORDED_STEPS - 1
    assert 0.75 * DELAY_S * 1e6 <= hold["per_step_us"] <= 1.25 * DELAY_S * 1e6, hold
    assert all(other["per_step_us"] < 0.25 * DELAY_S * 1e6 for other in others), others
    assert hold["step_percent"] > 50.0  # the sleep is most of each step
    healthy = json.loads(run_cli("analyze", str(before), "--json").stdout)["summary"]
    assert all(h["per_step_us"] < 0.25 * DELAY_S * 1e6 for h in healthy["held_up"]), healthy["held_up"]
    text = run_cli("analyze", str(after)).stdout
    assert "held the others up (the last to start a collective, from the runner-up's start to its own):\n" \
           "  rank 1: " in text
