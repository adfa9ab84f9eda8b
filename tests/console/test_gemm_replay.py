"""`tuiprof gemm-replay`: shapes the real hook recorded, replayed with the venv's PyTorch (CPU build).

The job is the stand-in GPU workload of the native tests under `tuiprof run` (the real hook library
over the stand-in cuBLAS, whose CUDA events give each GEMM a kernel time), read by a real agentd and
recorded with `tuiprof record`; beside it a CPU PyTorch training job under `tuiprof run`, a rank
that runs no GEMM. The replay runs on the CPU (the plumbing a GPU run uses, with perf_counter instead
of CUDA events).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from native.conftest import standins  # noqa: F401  (the stand-in GPU libraries, built with gcc)
from native.support import stand_in_rank, tuiprof_run
from testkit.agents import running_agent
from testkit.jobs import stop_job
from testkit.ports import free_port

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.analysis.gemm_replay import (
    TORCH_DTYPES, GemmShape, JobGemm, NoSuchRankError, RankChoice, choose_rank, job_gemms, not_replayable,
    parse_shape, reading,
)
from tuiprof.cli import main
from tuiprof.commands.gemm_timing import TorchDevice
from tuiprof.model import record
from tuiprof.model.events import HostUnreachable, SnapshotReceived

pytestmark = pytest.mark.slow

# What tests/native/standins/workload.c runs: (interposer, the hook's dtype name, shape).
STAND_IN_GEMMS = {
    ("cublasGemmEx", "bf16", "b=1 m=64 n=32 k=16"),
    ("cublasGemmStridedBatchedEx", "fp16", "b=4 m=8 n=8 k=8"),
    ("cublasSgemm_v2", "fp32", "b=1 m=16 n=16 k=16"),
    ("cublasLtMatmul", "bf16", "b=1 m=32 n=16 k=8"),
    ("cublasLtMatmul", "fp32", "b=2 m=16 n=8 k=4"),
}
JOB = "gemm-replay-test"

CPU_JOB = textwrap.dedent("""
    import sys, torch
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    print("READY", flush=True)
    sys.stdin.readline()
""")


@dataclasses.dataclass
class Recorded:
    agent_address: str
    gemm_pid: int  # the stand-in workload: GEMMs through the real hook
    cpu_pid: int  # a CPU PyTorch job: optimizer steps, no GEMM the hook sees
    recording: pathlib.Path


@pytest.fixture(scope="module")
def recorded(standins, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("gemm_replay")
    cpu_job = tuiprof_run(sys.executable, "-c", CPU_JOB, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={"RANK": "0", "WORLD_SIZE": "1", "TUIPROF_JOB_ID": "cpu-job"})
    try:
        assert cpu_job.stdout.readline().strip() == "READY"
        with (stand_in_rank(standins, {"RANK": "3", "WORLD_SIZE": "4", "TUIPROF_JOB_ID": JOB}) as rank,
              running_agent(tmp) as agent):
            recording = tmp / "job.ndjson"
            code = main(["record", str(recording), str(agent.address), "--duration", "3"])
            assert code == 0
            yield Recorded(str(agent.address), rank.pid, cpu_job.pid, recording)
    finally:
        stop_job(cpu_job)


def replay(*argv: str) -> list[str]:
    """``tuiprof gemm-replay ARGV`` as a user runs it; its stdout lines (exit 0 asserted)."""
    done = subprocess.run([sys.executable, "-m", "tuiprof.cli", "gemm-replay", *argv], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout.splitlines()


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``tuiprof gemm-replay ARGV`` in this process; its exit status and its one line on stderr."""
    code = main(["gemm-replay", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tuiprof gemm-replay: ")
    return code, err[0]


def rows(lines: list[str]) -> dict[tuple[str, str, str], list[str]]:
    """The report's per-signature blocks: (op, dtype, shape) → the block's lines."""
    blocks: dict[tuple[str, str, str], list[str]] = {}
    for number, line in enumerate(lines):
        if line and not line.startswith(" ") and " calls in the job)" in line:
            op, dtype, shape = line.split("  (")[0].split(" ", 2)
            blocks[op, dtype, shape] = lines[number + 1:number + 4]
    return blocks


def tflops_in(line: str, label: str) -> float:
    """The TFLOP/s figure of a report line ``  label: 0.00123 TFLOP/s (...)``."""
    assert line.lstrip().startswith(f"{label}:"), line
    return float(line.split(":", 1)[1].split("TFLOP/s")[0])


# ---------------------------------------------------------------- the hook's shapes

def test_shapes_the_hook_recorded_parse_and_map_to_torch_dtypes(recorded):
    torch = TorchDevice("cpu").torch

    events = list(record.read(recorded.recording))
    chosen = choose_rank(events, RankChoice(pid=recorded.gemm_pid))
    assert (chosen.rank, chosen.job_id) == (3, JOB)
    gemms = job_gemms(events, chosen)
    assert {(g.op, g.dtype, g.shape) for g in gemms} == STAND_IN_GEMMS
    for gemm in gemms:
        shape = parse_shape(gemm.shape)
        assert str(shape) == gemm.shape
        assert shape.flops == 2 * shape.b * shape.m * shape.n * shape.k > 0
        assert isinstance(getattr(torch, TORCH_DTYPES[gemm.dtype]), torch.dtype)
        assert not_replayable(gemm) is None
        # the agent's first reading of the rank covers its calls: a figure from the stand-in's kernel times
        assert gemm.in_job_tflops is not None and gemm.in_job_tflops > 0
        assert gemm.calls >= 2


def test_the_overflow_slot_and_unread_descriptors_are_not_replayed_as_shapes():
    assert "overflow slot" in not_replayable(JobGemm("other", "", "b=0 m=0 n=0 k=0"))
    assert "descriptors" in not_replayable(JobGemm("cublasLtMatmul", "unknown", "b=0 m=0 n=0 k=0"))
    assert "dtype 'cuda77'" in not_replayable(JobGemm("cublasGemmEx", "cuda77", "b=1 m=8 n=8 k=8"))
    assert "no FLOPs" in not_replayable(JobGemm("cublasGemmEx", "bf16", "b=1 m=0 n=8 k=8"))
    assert not_replayable(JobGemm("cublasGemmEx", "bf16", "b=1 m=8 n=8 k=8")) is None
    with pytest.raises(ValueError, match="not a GEMM shape"):
        parse_shape("b=1 m=8 n=8")


# ---------------------------------------------------------------- replays

def test_a_cpu_replay_of_two_small_shapes_gives_positive_tflops():
    device = TorchDevice("cpu")
    for shape, dtype, how in ((GemmShape(1, 64, 32, 16), "fp32", "torch.mm"),
                              (GemmShape(4, 8, 8, 8), "bf16", "torch.bmm")):
        figure = device.replay(shape, dtype, warmup_seconds=0.05, calls=7)
        assert figure.how == how and figure.calls == 7 and figure.flops == shape.flops
        assert math.isfinite(figure.tflops) and figure.tflops > 0
        # cuBLAS's m and n as PyTorch hands them to it: torch.mm(X[n,k], Y[k,m]) gives C's transpose, [n,m]
        gemm, _ = device._gemm(shape, dtype, getattr(device.torch, TORCH_DTYPES[dtype]))
        assert tuple(gemm().shape) == ((shape.b,) if shape.b > 1 else ()) + (shape.n, shape.m)


def test_a_dtype_torch_cannot_run_batched_is_a_line_not_a_crash():
    device = TorchDevice("cpu")
    refused = device.replay(GemmShape(2, 32, 32, 32), "int8", warmup_seconds=0.0, calls=2)
    assert "batched int8" in refused.reason


def test_recording_replayed_on_the_cpu(recorded):
    lines = replay("--recording", str(recorded.recording), "--pid", str(recorded.gemm_pid), "--device", "cpu",
                   "--warmup-seconds", "0.05", "--calls", "5")
    assert lines[0].startswith(f"GEMM replay of rank 3 (pid {recorded.gemm_pid} on ")
    assert "the hook does not bucket shapes" in "\n".join(lines)
    assert "neither operand transposed" in "\n".join(lines)
    blocks = rows(lines)
    assert set(blocks) == STAND_IN_GEMMS
    for in_job, alone, said in blocks.values():
        assert tflops_in(in_job, "in the job") > 0
        assert tflops_in(alone, "alone") > 0 and "median of 5 calls" in alone
        assert said.lstrip().startswith("reading:") and "->" in said


def test_live_agent_replayed_on_the_cpu(recorded, capsys):
    code = main(["gemm-replay", recorded.agent_address, "--pid", str(recorded.gemm_pid), "--device", "cpu",
                 "--seconds", "2", "--warmup-seconds", "0", "--calls", "3"])
    assert code == 0
    blocks = rows(capsys.readouterr().out.splitlines())
    assert set(blocks) == STAND_IN_GEMMS  # in-job figures may be n/a: the stand-in ran its GEMMs before
    assert all(tflops_in(alone, "alone") > 0 for _, alone, _ in blocks.values())


# ---------------------------------------------------------------- bad input: one line, exit 2 (1: no agent)

def test_no_such_rank(recorded, capsys):
    code, line = one_line_error(capsys, "--recording", str(recorded.recording), "--rank", "99", "--job", JOB,
                                "--device", "cpu")
    assert code == 2
    assert f"no rank 99 job {JOB} among the ranks seen: " in line and f"pid {recorded.gemm_pid}" in line


def test_a_rank_without_gemm(recorded, capsys):
    code, line = one_line_error(capsys, "--recording", str(recorded.recording), "--pid", str(recorded.cpu_pid),
                                "--device", "cpu")
    assert code == 2
    assert f"rank 0 (pid {recorded.cpu_pid} on " in line and "recorded no GEMM" in line


@pytest.mark.parametrize(("device", "says"), [
    ("xyz", "--device xyz: not a torch device"),
    ("mps", "--device mps: the replay runs on a CUDA GPU (cuda:N) or the CPU"),
    ("cuda:1", "--device cuda:1: this PyTorch"),
])
def test_a_device_this_torch_cannot_use(recorded, capsys, device, says):
    code, line = one_line_error(capsys, "--recording", str(recorded.recording), "--pid", str(recorded.gemm_pid),
                                "--device", device)
    assert code == 2
    assert says in line


def test_without_torch(recorded, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as where it is missing
    code, line = one_line_error(capsys, "--recording", str(recorded.recording), "--device", "cpu")
    assert code == 2
    assert "PyTorch, which cannot be imported here" in line and "pip install torch" in line


def test_no_agent_answers(capsys):
    port = free_port("127.0.0.1")
    code, line = one_line_error(capsys, f"127.0.0.1:{port}", "--device", "cpu", "--seconds", "1")
    assert code == 1
    assert "no agent sent a snapshot within 1 s" in line and f"127.0.0.1:{port}" in line


def test_bad_options(recorded, capsys):
    for argv, says in ((["--calls", "0"], "--calls 0: expected 1 or more"),
                       (["--seconds", "0"], "--seconds 0.0: expected a positive number"),
                       (["h1", "--recording", str(recorded.recording)], "name no HOST")):
        code, line = one_line_error(capsys, *argv, "--device", "cpu")
        assert code == 2 and says in line


# ---------------------------------------------------------------- pure parts: choosing the rank, the reading

def snapshot(*ranks: tuple[int, int | None, str]) -> pb.HostSnapshot:
    message = pb.HostSnapshot()
    for pid, rank, job in ranks:
        stats = message.ranks.add(pid=pid, job_id=job)
        if rank is not None:
            stats.rank = rank
    return message


def test_choosing_among_several_ranks_and_jobs():
    events = [SnapshotReceived("n1", 1.0, snapshot((10, 0, "a"), (11, 1, "a"), (12, 0, "b"))),
              SnapshotReceived("n2", 1.0, snapshot((10, 1, "b"))),
              HostUnreachable("n3", 1.0, "connection refused")]
    assert choose_rank(events, RankChoice(rank=1, job="b")).host == "n2"
    assert choose_rank(events, RankChoice(pid=11)).rank == 1
    with pytest.raises(NoSuchRankError, match=r"^4 rank processes here: .*choose one with --rank N and --job ID, or --pid"):
        choose_rank(events, RankChoice())
    with pytest.raises(NoSuchRankError, match=r"^rank 0 matches 2 processes: .*choose one with --job ID, or --pid PID$"):
        choose_rank(events, RankChoice(rank=0))
    with pytest.raises(NoSuchRankError, match="pid 10 matches 2 processes: .*name the one HOST it runs on"):
        choose_rank(events, RankChoice(pid=10))
    with pytest.raises(NoSuchRankError, match="no rank 7 among .*; n3 unreachable: connection refused$"):
        choose_rank(events, RankChoice(rank=7))
    with pytest.raises(NoSuchRankError, match="no rank in the snapshots"):
        choose_rank([SnapshotReceived("n1", 1.0, snapshot())], RankChoice())


def test_in_job_tflops_are_flops_over_kernel_time_across_intervals():
    # 10 calls at 100 TFLOP/s and 10 at 10 (they waited on another process): 20 calls' FLOPs over their time
    assert JobGemm("op", "bf16", "b=1 m=8 n=8 k=8", [(100.0, 10.0), (10.0, 10.0)]).in_job_tflops == \
        pytest.approx(20 / (10 / 100 + 10 / 10))
    assert JobGemm("op", "bf16", "b=1 m=8 n=8 k=8", [(100.0, 0.0), (25.0, 0.0)]).in_job_tflops == pytest.approx(40.0)
    assert JobGemm("op", "bf16", "b=1 m=8 n=8 k=8").in_job_tflops is None


def test_the_reading_tells_a_slow_gpu_from_contention():
    assert reading(100.0, 60.0).startswith("fast alone (1.67x the job's) -> contention or the job's surroundings")
    assert reading(100.0, 85.0).startswith("as fast alone as in the job (1.18x) -> not contention: the GPU's own speed")
    assert reading(50.0, 100.0).startswith("slower alone (0.50x the job's)")
    assert reading(50.0, None).startswith("no in-job figure")


def test_torch_is_imported_only_when_a_replay_runs():
    code = "import sys, tuiprof.cli; tuiprof.cli.command_parser(['gemm-replay']); print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"
