"""The shipped systemd unit is valid and starts agentd the way the CLI documents."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

import agentd

UNIT = pathlib.Path(agentd.__file__).parent / "systemd" / "agentd.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart exists: point it at this environment's agentd.
    installed = pathlib.Path(sys.executable).parent / "agentd"
    unit = tmp_path / "agentd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/agentd", str(installed)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_unit_does_not_restart_on_configuration_errors_but_retries_a_taken_port():
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/agentd --log-format json" in text
    assert "RestartPreventExitStatus=2 3\n" in text  # agentd.errors: usage, token/TLS; 4 (port in use) retried
    assert "Restart=on-failure" in text and "RestartSec=5" in text


def test_unit_gives_the_agent_its_run_folder_for_the_kineto_sockets():
    from agentd.kineto.endpoint import USER_FOLDERS

    text = UNIT.read_text()
    assert USER_FOLDERS.startswith("/run/tuiprof/")  # writable under ProtectSystem=strict only as RuntimeDirectory
    assert "RuntimeDirectory=tuiprof\n" in text and "RuntimeDirectoryMode=0711" in text
    assert "RuntimeDirectoryPreserve=yes" in text  # running jobs keep their sockets across a restart
