"""`tuiprof trace` argument errors (exit 2) and unreachable agents (exit 1), and `tuiprof analyze` on real traces, without PyTorch."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from testkit.ports import free_port
from testkit.traces import run_cli


@pytest.mark.parametrize("args, message", [
    (["--kind", "timeline", "--iterations", "3"], "--kind timeline takes --duration-ms or --last-events"),
    (["--last-events", "5"], "--last-events is for --kind timeline"),
    (["--duration-ms", "0"], "--duration-ms must be a positive number"),
    (["--duration-ms", "10", "--pids", "1,x"], "expected comma-separated integers"),
    (["--duration-ms", "10", "somehost:99999"], "bad host 'somehost:99999'"),
])
def test_bad_arguments_exit_2_with_the_reason(args, message, tmp_path):
    result = run_cli("trace", *args, "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_unreachable_agent_exits_1_and_says_so(tmp_path):
    port = free_port()
    result = run_cli("trace", f"127.0.0.1:{port}", "--duration-ms", "10", "--output", str(tmp_path / "out"),
                     "--json")
    assert result.returncode == 1
    [host] = json.loads(result.stdout)["hosts"]
    assert host["host"] == f"127.0.0.1:{port}" and host["error"].startswith("cannot connect")


CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"


def test_analyze_a_folder_of_real_traces_writes_the_merged_timeline(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for name in ("hta_nccl_rank0.json.gz", "hta_nccl_rank1.json.gz"):
        shutil.copy(CORPUS / name, folder / name)
    result = run_cli("analyze", str(folder), "--output", str(tmp_path / "m.json.gz"), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [r["rank"] for r in document["summary"]["ranks"]] == [0, 1]
    assert document["merged"]["path"] == str(tmp_path / "m.json.gz") and document["merged"]["linked_collectives"] > 0
    assert set(document["summary"]) >= {"ranks", "worst_collectives", "collective_matching", "top_kernels"}
    text = run_cli("analyze", str(folder))
    assert text.returncode == 0 and "rank 1 in" in text.stdout
    # Terminal lines stay short; --json keeps the full kernel names.
    assert max(len(line) for line in text.stdout.splitlines()) < 500
    assert "…" in text.stdout


def test_analyze_a_trace_without_gpu_events_says_so(tmp_path):
    result = run_cli("analyze", str(CORPUS / "hta_gloo_cpu_only_rank34.json.gz"))
    assert result.returncode == 0
    assert "no GPU kernel, memcpy or memset events in the trace" in result.stderr
    assert "GPU split: n/a (no GPU kernel" in result.stdout


def test_analyze_bad_input_exits_2_with_one_line(tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((CORPUS / "hta_alexnet.json.gz").read_bytes()[:5000])
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": 1}')
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([str(cut)], "cut.json.gz: truncated gzip"),
        ([str(notes)], "notes.json: not a Kineto/Chrome trace"),
        ([str(empty)], "no .json or .json.gz files in this folder"),
        ([str(tmp_path / "missing.json")], "missing.json: no such file or folder"),
        ([str(CORPUS / "hta_nccl_rank0.json.gz"), str(CORPUS / "hta_alexnet.json.gz")], "mixed jobs:"),
        # An H100 Triton run and an MI250 run, neither with a rank: two jobs, not two ranks of one.
        ([str(CORPUS / "hta_triton.json.gz"), str(CORPUS / "hta_rocm62_mi250.json.gz")],
         "hta_triton.json.gz has no rank (no distributedInfo, no rank<N> in its name)"),
    ]
    for paths, message in cases:
        result = run_cli("analyze", *paths)
        assert result.returncode == 2, (paths, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
