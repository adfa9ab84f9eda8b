"""The host view's GPUs tab lists the highlighted GPU's compute processes, naming the rank a pid belongs to
and where each runs (container, pod, SLURM job, its pid in there)."""

from __future__ import annotations

from textual.widgets import DataTable, Label

from agentd.containers import SAME_PID_NAMESPACE
from agentd.proto import tuiprof_agent_pb2 as pb
from console.conftest import open_host_tab
from tuiprof.client.sources import ReplaySource
from tuiprof.model.events import SnapshotReceived
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.host import HostScreen

GIB = 2**30
TAKEN_AT = 1_795_000_000  # the snapshot's time, unix seconds
POD = pb.Container(runtime="containerd", id="ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
                   pod_uid="0125ec2f-b64a-4868-8f5b-94b56cbab864", pod_name="trainer-2", pod_namespace="team-a",
                   own_mount_namespace=True)


def two_gpus() -> pb.HostSnapshot:
    """GPU 0: rank 3 of job 77 in a Kubernetes pod, a non-rank process on the host (first seen: no
    CPU use yet), and one in another pid namespace whose memory NVML does not give; GPU 1: nothing running."""
    message = pb.HostSnapshot(hostname="n1", sequence=1, timestamp_unix_ns=TAKEN_AT * 10**9)
    for name in ("host", "gpu", "ranks"):
        message.collectors.add(name=name, available=True)
    busy = message.gpus.add(index=0, name="NVIDIA H100", memory_total_bytes=80 * GIB, processes_age_seconds=3.2,
                            processes_interval_seconds=5)
    busy.processes.add(pid=4100, name="python", used_memory_bytes=60 * GIB, user="alice",
                       command="python train.py --lr 3e-4", sm_percent=87.0, uid=1000, pid_in_container=57,
                       container=POD, cpu_percent=412.6, resident_memory_bytes=12 * GIB,
                       start_time_unix_seconds=TAKEN_AT - (2 * 86400 + 3 * 3600 + 4 * 60 + 5.7))
    busy.processes.add(pid=5200, name="")
    for field in ("user", "command", "uid", "pid_in_container", "cpu_percent", "resident_memory_bytes",
                  "start_time_unix_seconds"):
        busy.unavailable[f"processes[5200].{field}"] = "not visible to the agent (another PID namespace)"
    busy.unavailable["processes[5200].used_memory_bytes"] = "NVML gives no per-process memory here"
    busy.unavailable["processes[5200].sm_percent"] = "NVML: Not Supported"
    busy.processes.add(pid=6300, name="nvtop-probe", used_memory_bytes=GIB, user="root", command="nvtop-probe -1",
                       uid=0, resident_memory_bytes=300 * 2**20, start_time_unix_seconds=TAKEN_AT - 65)
    busy.unavailable["processes[6300].cpu_percent"] = "first sample"
    busy.unavailable["processes[6300].sm_percent"] = "NVML gave no utilization sample of this process in the interval"
    busy.unavailable["processes[6300].pid_in_container"] = SAME_PID_NAMESPACE
    message.gpus.add(index=1, name="NVIDIA H100", memory_total_bytes=80 * GIB)
    message.ranks.add(pid=4100, rank=3, job_id="77", state=pb.RANK_STATE_RUNNING)
    return message


async def test_gpu_tab_lists_the_highlighted_gpus_processes_with_their_rank() -> None:
    app = TuiprofApp(ReplaySource([SnapshotReceived("n1", 1.0, two_gpus())], speed=0))
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_host_tab(app, pilot, "gpus")
        assert isinstance(screen, HostScreen)
        table = screen.query_one("#gpu-procs-table", DataTable)
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows == [
            ["4100", "alice", "python", "60.0 GiB", "75%", "87%", "413%", "12.0 GiB", "2-03:04:05", "rank 3", "77",
             "pod team-a/trainer-2, pid 57", "python train.py --lr 3e-4"],
            ["6300", "root", "nvtop-probe", "1.00 GiB", "1%", "n/a", "n/a", "300 MiB", "01:05", "not a rank", "",
             "host", "nvtop-probe -1"],
            ["5200", "n/a", "not visible", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "not a rank", "", "host", "n/a"],
        ]
        title = screen.query_one("#gpu-procs-title", Label)
        # Every n/a cell has its reason, as the agent gave it.
        assert str(title.render()) == (
            "Processes on GPU 0 · read 3 s ago (every 5 s) · pid 6300: SM: n/a (NVML gave no utilization sample of "
            "this process in the interval); pid 6300: CPU: n/a (first sample); pid 5200: GPU memory: n/a (NVML gives "
            "no per-process memory here); pid 5200: SM: n/a (NVML: Not Supported); pid 5200: CPU, Host mem, Time, "
            "User, Command: n/a (not visible to the agent (another PID namespace))")
        await pilot.press("j")
        assert str(title.render()) == "Processes on GPU 1"  # no age given (an agent that reads them every tick)
        assert [str(cell) for cell in table.get_row_at(0)][0] == "no compute processes"
        assert table.row_count == 1


def test_status_json_gives_each_process_field_the_agent_could_not_read_with_its_reason() -> None:
    from tuiprof.model.convert import to_json
    from tuiprof.model.messages import HostSnapshot

    [busy, _] = to_json(HostSnapshot.from_proto(two_gpus()))["gpus"]
    by_pid = {process["pid"]: process for process in busy["processes"]}
    assert (by_pid[4100]["user"], by_pid[4100]["sm_percent"], "unavailable" in by_pid[4100]) == ("alice", 87.0, False)
    assert (by_pid[4100]["pid_in_container"], by_pid[4100]["container"]) == (57, {
        "runtime": "containerd", "id": POD.id, "pod_uid": POD.pod_uid, "pod_name": "trainer-2",
        "pod_namespace": "team-a", "slurm_job_id": "", "slurm_step": "", "own_mount_namespace": True})
    assert (by_pid[4100]["cpu_percent"], by_pid[4100]["resident_memory_bytes"]) == (412.6, 12 * GIB)
    assert by_pid[6300]["unavailable"] == {"pid_in_container": SAME_PID_NAMESPACE, "sm_percent": (
        "NVML gave no utilization sample of this process in the interval"), "cpu_percent": "first sample"}
    hidden = by_pid[5200]
    assert hidden["user"] is None and hidden["command"] is None and hidden["sm_percent"] is None
    assert hidden["unavailable"] == {
        "user": "not visible to the agent (another PID namespace)",
        "command": "not visible to the agent (another PID namespace)",
        "uid": "not visible to the agent (another PID namespace)",
        "pid_in_container": "not visible to the agent (another PID namespace)",
        "cpu_percent": "not visible to the agent (another PID namespace)",
        "resident_memory_bytes": "not visible to the agent (another PID namespace)",
        "start_time_unix_seconds": "not visible to the agent (another PID namespace)",
        "used_memory_bytes": "NVML gives no per-process memory here",
        "sm_percent": "NVML: Not Supported",
    }
