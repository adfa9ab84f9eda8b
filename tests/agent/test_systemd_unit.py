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


def test_unit_does_not_restart_on_configuration_errors():
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/agentd --log-format json" in text
    assert "RestartPreventExitStatus=2 3 4" in text  # agentd.errors exit codes
