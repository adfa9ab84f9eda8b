"""On a node whose /proc hides other users' processes (hidepid=2), the root agent does not undo it: a
GPU process's name, user and command line go only to its owner, root and the token holder.

The GPU is the stand-in libnvidia-ml.so.1 of bench/console/fake_nvml.c (compiled here), which puts the
processes named in $FAKE_NVML_PIDS on its one device; /proc is a new instance mounted with
hidepid=2 inside the test's private mount namespace (the host's is untouched)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from hostile.conftest import PYTHON, wait_ready

REPO = pathlib.Path(__file__).resolve().parents[2]
SECRET = "--api-key=root-secret-3c9d"
WAITER = "import sys; print('ready', flush=True); sys.stdin.read()"


@pytest.fixture
def fake_nvml(tmp_path_factory) -> pathlib.Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (build-essential) for the stand-in NVML")
    folder = tmp_path_factory.mktemp("nvml")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(folder / "libnvidia-ml.so.1"),
                    str(REPO / "bench" / "console" / "fake_nvml.c")], check=True)
    folder.chmod(0o755)
    return folder


def test_hidepid_keeps_roots_gpu_command_line_from_another_user(namespace, hostile_user, agent_in_namespace,
                                                                fake_nvml):
    namespace.run(["mount", "-t", "proc", "-o", "hidepid=2", "proc", "/proc"]).check_returncode()
    root_job = wait_ready(namespace.popen([PYTHON, "-c", WAITER, SECRET],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    theirs = wait_ready(namespace.popen([PYTHON, "-c", WAITER, "--their-own-flag"], user=hostile_user,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        env = namespace.env(None) | {"LD_LIBRARY_PATH": str(fake_nvml),
                                     "FAKE_NVML_PIDS": f"{root_job.pid},{theirs.pid}"}
        agent = agent_in_namespace(env=env)
        as_user = agent.client("gpu-processes", user=hostile_user, timeout=30)
        as_root = agent.client("gpu-processes", timeout=30)
    finally:
        for process in (root_job, theirs):
            process.kill()
            process.wait(10)
    assert as_root["code"] == "OK" and as_user["code"] == "OK", (as_root, as_user)
    roots_view = {p["pid"]: p for p in as_root["processes"]}
    assert SECRET in roots_view[root_job.pid]["command"]  # root sees everything
    assert {"resident_memory_bytes", "start_time_unix_seconds"} <= set(roots_view[root_job.pid])
    users_view = {p["pid"]: p for p in as_user["processes"]}
    hidden = users_view[root_job.pid]
    assert "command" not in hidden and "user" not in hidden and not hidden.get("name"), hidden
    assert not {"cpu_percent", "resident_memory_bytes", "start_time_unix_seconds"} & set(hidden), hidden  # as ps
    assert as_user["unavailable"][f"processes[{root_job.pid}].command"].startswith(
        "private: /proc is mounted hidepid=invisible on this host")
    assert "--their-own-flag" in users_view[theirs.pid]["command"]  # their own stays theirs to see
    assert SECRET not in str(as_user)
