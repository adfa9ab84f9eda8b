"""``--version`` on both command lines: the installed package's version, as the agent reports it in GetInfo."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from testkit.agents import agentd_command


def test_tuiprof_and_agentd_print_the_installed_version():
    version = metadata.version("tuiprof")
    console = subprocess.run([sys.executable, "-m", "tuiprof.cli", "--version"], capture_output=True, text=True,
                             timeout=60)
    assert (console.returncode, console.stdout) == (0, f"tuiprof {version}\n"), console.stderr
    agent = subprocess.run(agentd_command(["--version"]), capture_output=True, text=True, timeout=60)
    assert (agent.returncode, agent.stdout) == (0, f"agentd {version}\n"), agent.stderr
