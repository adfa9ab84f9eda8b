"""`tuiprof run` in front of real Python processes: the real PyTorch CPU build
(optimizer steps, GC pauses, DataLoader waits through the startup hook), a
Python process with no CUDA and no torch (must run unchanged), an existing
sitecustomize (must still run), and fork (the child gets its own segment)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from itertools import pairwise


from native.support import HOOK, segment_path, tuiprof_run
from tuiprof.commands.run import launch_environment
from tuiprof_native import segment

TRAIN = textwrap.dedent("""
    import gc, json, os
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 2)), batch_size=4)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    gc.collect()
    gc.collect()
    print(json.dumps({"pid": os.getpid(), "weight": model.weight.sum().item()}))
""")


def run_script(script: str, hooked: bool, cleanup: list[int], env: dict | None = None):
    cmd = [sys.executable, "-c", script]
    if hooked:
        proc = tuiprof_run(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or {})
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
    cleanup.append(proc.pid)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err, proc.pid


def test_torch_training_steps_gc_and_dataloader(cleanup_segments):
    rc, out, err, pid = run_script(TRAIN, True, cleanup_segments)
    assert rc == 0, err
    plain_rc, plain_out, _, _ = run_script(TRAIN, False, cleanup_segments)
    assert json.loads(out)["weight"] == json.loads(plain_out)["weight"]  # same training result
    with segment.Segment(segment_path(pid)) as seg:
        header = seg.header()
        c = header.counters
        assert c.step_count == 10  # 40 samples / batch 4, one optimizer.step() each
        assert c.dataloader_count == 11  # 10 batches + the call that raises StopIteration
        assert c.gc_count >= 2 and c.gc_pause_total_ns > 0  # the two explicit collections at least
        assert c.step_time_total_ns > 0 and c.last_step_time_ns > 0
        steps = [e for e in seg.events() if e.kind == "step"]
        assert [e.op_seq for e in steps] == list(range(1, 11))
        assert all(a.end_ns <= b.start_ns for a, b in pairwise(steps))
        assert header.flags & segment.FLAG_EXITED


def test_python_without_cuda_runs_unchanged(cleanup_segments):
    script = "import sys; print(sum(range(100))); print('to stderr', file=sys.stderr); sys.exit(3)"
    hooked = run_script(script, True, cleanup_segments)
    plain = run_script(script, False, cleanup_segments)
    assert hooked[:3] == plain[:3] == (3, "4950\n", "to stderr\n")
    assert not segment_path(hooked[3]).exists()  # nothing to record, so no segment


def test_existing_sitecustomize_still_runs(cleanup_segments, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.MARKER = 'site ran'\n")
    rc, out, err, _ = run_script("print(MARKER)", True, cleanup_segments, env={"PYTHONPATH": str(site)})
    assert (rc, out) == (0, "site ran\n"), err


def test_launch_environment_prepends_and_keeps():
    env = launch_environment({"LD_PRELOAD": "/a.so /b.so", "PYTHONPATH": "/x", "KINETO_USE_DAEMON": "0"})
    assert env["LD_PRELOAD"] == f"{HOOK}:/a.so:/b.so"
    assert env["NCCL_PROFILER_PLUGIN"] == str(HOOK)
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/x"]
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("tuiprof_native/startup")
    assert env["KINETO_USE_DAEMON"] == "0"
    # Daemon mode only with a private Kineto folder from the agent (issue 24 item 1).
    assert "KINETO_USE_DAEMON" not in launch_environment({})
    private = launch_environment({}, kineto_socket_dir="/run/tuiprof/kineto/0")
    assert (private["KINETO_USE_DAEMON"], private["KINETO_IPC_SOCKET_DIR"]) == ("1", "/run/tuiprof/kineto/0")
    again = launch_environment(env)  # nested `tuiprof run` does not stack the library twice
    assert again["LD_PRELOAD"] == env["LD_PRELOAD"]


def test_missing_command_and_unknown_program():
    usage = subprocess.run([sys.executable, "-m", "tuiprof.cli", "run"], capture_output=True, text=True)
    assert usage.returncode == 2 and "no command given" in usage.stderr
    missing = subprocess.run([sys.executable, "-m", "tuiprof.cli", "run", "--", "/nonexistent/prog"],
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot run '/nonexistent/prog'" in missing.stderr


FORK = textwrap.dedent("""
    import ctypes, os, json
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_flush.argtypes = [ctypes.c_int]
    lib.tuiprof_record_step()
    child = os.fork()
    if child == 0:
        for _ in range(3):
            lib.tuiprof_record_step()
        lib.tuiprof_flush(2000)
        os._exit(0)
    os.waitpid(child, 0)
    lib.tuiprof_record_step()
    lib.tuiprof_record_step()
    print(json.dumps({"child": child}))
""")


def test_fork_child_gets_its_own_segment(cleanup_segments):
    rc, out, err, pid = run_script(FORK, True, cleanup_segments)
    assert rc == 0, err
    child = json.loads(out)["child"]
    cleanup_segments.append(child)
    with segment.Segment(segment_path(pid)) as parent_seg, segment.Segment(segment_path(child)) as child_seg:
        assert parent_seg.header().counters.step_count == 3
        assert child_seg.header().pid == child
        assert child_seg.header().counters.step_count == 3
        assert not child_seg.header().flags & segment.FLAG_EXITED  # os._exit skips exit handlers


DIST_TRAIN = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    os.write(1, f"worker pid={os.getpid()}\\n".encode())  # one write: the two workers share the pipe
    dist.destroy_process_group()
""")


def test_in_front_of_torch_distributed_run(cleanup_segments, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DIST_TRAIN)
    proc = tuiprof_run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       str(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"OMP_NUM_THREADS": "1"})
    out, err = proc.communicate(timeout=240)
    workers = [int(pid) for pid in re.findall(r"^worker pid=(\d+)$", out, re.MULTILINE)]
    cleanup_segments.extend(workers)
    assert proc.returncode == 0 and len(workers) == 2, f"stdout:\n{out}\nstderr:\n{err}"
    assert not segment_path(proc.pid).exists()  # the launcher itself records nothing
    ranks = set()
    for pid in workers:
        with segment.Segment(segment_path(pid)) as seg:
            header = seg.header()
            assert header.counters.step_count == 5
            assert header.world_size == 2 and header.local_rank == header.rank
            ranks.add(header.rank)
    assert ranks == {0, 1}
