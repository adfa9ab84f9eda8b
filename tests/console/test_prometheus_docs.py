"""The Prometheus files the README shows (docs/prometheus/) are valid, tested, and agree with the console."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

from console.prometheus_server import PROMTOOL
from tuiprof.client.prometheus import FIGURES, HostSelection, column_queries

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "prometheus"
RULES = DOCS / "tuiprof-rules.yml"

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt package prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=DOCS, check=False)


def test_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", "tuiprof-rules.yml", "tuiprof-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_config_passes_promtool_check() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout


def test_rules_compute_what_their_tests_expect() -> None:
    """Recording rules on sample series, and the hang alert firing only after its minute."""
    result = promtool("test", "rules", "tuiprof-rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_are_the_consoles_queries() -> None:
    recorded = dict(re.findall(r"- record: (\S+)\n\s+expr: (.+)", RULES.read_text()))
    queries = column_queries(HostSelection())
    rules = [figure for figure in FIGURES.values() if figure.recorded]
    assert rules, "no figure is recorded"
    for figure in rules:
        assert recorded[figure.recorded] == queries[figure.name], figure.recorded
