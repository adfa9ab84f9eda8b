"""How squeue/scontrol output becomes a job's node list, and how a job that holds no nodes is explained."""

from __future__ import annotations

import pytest

from tuiprof.client.slurm import (
    BadJobIdError,
    JobNotRunningError,
    JobRow,
    SlurmCommandError,
    UnknownJobError,
    active_nodelists,
    check_job_id,
    parse_hostnames,
    parse_squeue,
)


@pytest.mark.parametrize("text, expected", [("4242", "4242"), (" 4242\n", "4242"), ("4242_7", "4242_7"), ("4242+1", "4242+1")])
def test_job_ids_squeue_accepts(text: str, expected: str) -> None:
    assert check_job_id(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "4242_", "42 43", "4242;rm -rf /", "4242,4243"])
def test_other_job_ids_are_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(BadJobIdError, match="expected a number such as 4242"):
        check_job_id(text)


def test_squeue_rows() -> None:
    output = "RUNNING|None|node[01-04]\n\nPENDING|Resources|\n"
    assert parse_squeue(output) == [
        JobRow("RUNNING", "None", "node[01-04]"),
        JobRow("PENDING", "Resources", ""),
    ]


@pytest.mark.parametrize("line", ["RUNNING node1", "RUNNING|None|node1|extra", "|None|node1"])
def test_unexpected_squeue_lines_are_errors(line: str) -> None:
    with pytest.raises(SlurmCommandError, match="unexpected squeue output line"):
        parse_squeue(line)


def test_only_rows_holding_nodes_count() -> None:
    # An array job with one task running, one completing and one still waiting.
    rows = [
        JobRow("RUNNING", "None", "gpu[1-2]"),
        JobRow("PENDING", "Priority", ""),
        JobRow("COMPLETING", "None", "gpu7"),
    ]
    assert active_nodelists("9_1", rows) == ["gpu[1-2]", "gpu7"]


def test_pending_job_says_its_state_and_reason() -> None:
    with pytest.raises(JobNotRunningError) as caught:
        active_nodelists("12", [JobRow("PENDING", "Resources", "")])
    assert caught.value.states == ("PENDING",)
    message = str(caught.value)
    assert "job 12 is not running (PENDING, reason Resources)" in message
    assert "wait until `squeue -j 12` shows it RUNNING" in message


def test_finished_job_says_its_state() -> None:
    with pytest.raises(JobNotRunningError) as caught:
        active_nodelists("13", [JobRow("FAILED", "NonZeroExitCode", "node3")])
    assert caught.value.states == ("FAILED",)
    assert "job 13 is not running (FAILED, reason NonZeroExitCode)" in str(caught.value)
    assert "pick a running job" in str(caught.value)


def test_no_rows_means_unknown_job() -> None:
    with pytest.raises(UnknownJobError, match="SLURM does not know job 14"):
        active_nodelists("14", [])


def test_hostnames_keep_order_and_drop_repeats() -> None:
    assert parse_hostnames("node2\nnode10\n\nnode2\nnode3\n") == ["node2", "node10", "node3"]
