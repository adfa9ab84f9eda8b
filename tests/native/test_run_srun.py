"""`tuiprof run srun ...` on a real SLURM cluster (munged, slurmctld, slurmd on this
machine): every task srun starts inherits the launch environment and gets its own
segment, with its rank, local rank and world size from SLURM_PROCID / SLURM_LOCALID /
SLURM_NTASKS and the job id from SLURM_JOB_ID; srun itself records nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from native.support import segment_path, tuiprof_run
from testkit.slurm import SlurmCluster, slurm_cluster, unavailable_reason
from tuiprof_native import segment

pytestmark = pytest.mark.slow

# One task: record a step (which makes the segment) and say who it is as SLURM sees it.
TASK = ("import ctypes, json, os; ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']).tuiprof_record_step(); "
        "print(json.dumps({'pid': os.getpid(), 'procid': int(os.environ['SLURM_PROCID']), "
        "'localid': int(os.environ['SLURM_LOCALID']), 'job': os.environ['SLURM_JOB_ID']}), flush=True)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with slurm_cluster(node_count=1) as running:
        yield running


def test_each_srun_task_gets_its_own_segment(cluster, cleanup_segments):
    # -O: two tasks on the one test node, which has one CPU
    proc = tuiprof_run("srun", "-N1", "-n2", "-O", sys.executable, "-c", TASK,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cluster.env)
    out, err = proc.communicate(timeout=60)
    tasks = [json.loads(line) for line in out.splitlines()]
    cleanup_segments.extend(task["pid"] for task in tasks)
    assert proc.returncode == 0, err + cluster.logs()
    assert sorted(task["procid"] for task in tasks) == [0, 1]
    assert sorted(task["localid"] for task in tasks) == [0, 1]  # both on the one node
    assert len({task["job"] for task in tasks}) == 1 and len({task["pid"] for task in tasks}) == 2
    for task in tasks:
        with segment.Segment(segment_path(task["pid"])) as seg:
            header = seg.header()
        assert (header.pid, header.rank, header.local_rank, header.world_size) == (
            task["pid"], task["procid"], task["localid"], 2)
        assert header.job_id == task["job"]
        assert header.counters.step_count == 1
    assert not segment_path(proc.pid).exists()  # srun (what tuiprof run exec'd) records nothing
