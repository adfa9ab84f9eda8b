"""`tuiprof trace` with no host traces this host through an embedded agent, like `status` and `stacks`."""

from __future__ import annotations

import json
import pathlib

import pytest

from agentd.address import DEFAULT_AGENT_PORT
from native.conftest import standins  # noqa: F401  (the stand-in GPU libraries, built with gcc)
from testkit.traces import run_cli
from traces.test_timeline import workload  # noqa: F401  (the stand-in job as rank 3, under `tuiprof run`)

pytestmark = pytest.mark.slow


def test_no_host_dumps_this_hosts_rank_through_an_embedded_agent(workload, tmp_path):  # noqa: F811
    result = run_cli("trace", "--kind", "timeline", "--last-events", "1000", "--pids", str(workload.pid),
                     "--output", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    [host] = doc["hosts"]
    # The embedded agent binds a free loopback port, never the system agent's.
    assert host["host"].startswith("127.0.0.1:") and host["host"] != f"127.0.0.1:{DEFAULT_AGENT_PORT}"
    [target] = host["targets"]
    assert (target["pid"], target["rank"], target["state"]) == (workload.pid, 3, "written")
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    assert trace["distributedInfo"]["rank"] == 3
    # The stand-in job's GEMMs and collectives (which of them and how many: tests/traces/test_timeline.py).
    kernels = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
    assert "cublasGemmEx" in kernels and "nccl:AllReduce" in kernels
    # The agent's own copy lived in a folder of this command only.
    assert not list(pathlib.Path("/tmp").glob("tuiprof-trace-agent-*/timeline"))
