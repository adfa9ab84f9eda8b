"""Timelines by parallel group (issue 30 item 3): a real four-rank gloo job with two families of process groups,
merged by `tuiprof analyze`, laid out by the groups the traces list or by --groups; collectives linked only within
their communicator; same-shape matmuls linked across one dimension's groups on request."""

from __future__ import annotations

import gzip
import json
import pathlib
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from testkit.ports import free_port
from testkit.traces import run_cli
from tuiprof.analysis.parallel_groups import (
    GroupsSpecError, ProcessGroup, layout_from_process_groups, layout_from_spec, parse_groups, thread_groups,
)

JOB = pathlib.Path(__file__).parent / "gloo_groups_job.py"
TEARDOWN_ABORT = "terminate called without an active exception"  # as in test_trace_diff: run once more
# The job's groups by the name PyTorch gives them (a counter, in the order they are made).
COMMUNICATORS = {"0": {0, 1, 2, 3}, "1": {0, 1}, "2": {2, 3}, "3": {0, 2}, "4": {1, 3}}
RECORDED_STEPS = 2
RANK_IN_NAME = re.compile(r"\(rank (\d+)\)")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("gloo-groups")
    for _ in range(2):
        done = subprocess.run([sys.executable, str(JOB), str(out), str(free_port())], capture_output=True, text=True,
                              timeout=240)
        if done.returncode == 0 or TEARDOWN_ABORT not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.json" for r in range(4)]
    return out


def analyze(traces: pathlib.Path, output: pathlib.Path, *options: str) -> tuple[dict, dict]:
    done = run_cli("analyze", str(traces), "--output", str(output), "--json", *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), json.loads(gzip.decompress(output.read_bytes()))


def track_names(merged: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}


def chains(merged: dict, category: str) -> dict[int, list[dict]]:
    found = defaultdict(list)
    for event in merged["traceEvents"]:
        if event.get("cat") == category:
            found[event["id"]].append(event)
    return found


def ranks_of(chain: list[dict], names: dict[int, str]) -> set[int]:
    return {int(RANK_IN_NAME.search(names[hop["pid"]]).group(1)) for hop in chain}


def test_the_traces_process_groups_lay_the_ranks_out_and_link_each_collective_within_its_communicator(
        traces, tmp_path):
    document, merged = analyze(traces, tmp_path / "m.json.gz")
    assert document["merged"]["groups"] == "group1(2)-group2(2) (from process groups)"
    names = track_names(merged)
    cpu = sorted(name for name in names.values() if "CPU pid" in name)
    assert [name.split(" ·")[0] for name in cpu] == ["group1=0 group2=0 (rank 0)", "group1=0 group2=1 (rank 2)",
                                                     "group1=1 group2=0 (rank 1)", "group1=1 group2=1 (rank 3)"]
    flows = chains(merged, "collective")
    complete = defaultdict(int)
    for chain in flows.values():
        group = re.search(r" on group (\d+)$", chain[0]["name"]).group(1)
        # Never across communicators. gloo's spans do not name their group: a rank whose worker threads
        # cannot be told apart (their ids interleave with the other ranks' threads, made at the same moment:
        # the four ranks make each group together, which happens often) has its calls linked to nothing,
        # so a chain may lack it, or there may be none for a communicator, or none at all.
        assert ranks_of(chain, names) <= COMMUNICATORS[group], chain[0]["name"]
        complete[group] += ranks_of(chain, names) == COMMUNICATORS[group]
    assert set(complete) <= set(COMMUNICATORS), complete  # (on a busy machine there may be no link at all)
    assert document["merged"]["linked_collectives"] == len(flows) <= len(COMMUNICATORS) * RECORDED_STEPS


def test_groups_option_names_and_orders_the_ranks_by_their_coordinates(traces, tmp_path):
    document, merged = analyze(traces, tmp_path / "m.json.gz", "--groups", "dp2-tp2")
    assert document["merged"]["groups"] == "dp2-tp2 (from --groups dp2-tp2)"
    names = track_names(merged)
    order = {e["args"]["sort_index"]: names[e["pid"]] for e in merged["traceEvents"]
             if e.get("name") == "process_sort_index" and "CPU pid" in names[e["pid"]]}
    # dp varies fastest: rank 1 is dp1 tp0; the outermost dimension (tp) sorts first, so a tp group sits together.
    assert [order[k].split(" ·")[0] for k in sorted(order)] == [
        "dp0 tp0 (rank 0)", "dp1 tp0 (rank 1)", "dp0 tp1 (rank 2)", "dp1 tp1 (rank 3)"]
    assert merged["tuiprof"]["ranks"][1]["groups"] == {"dp": 1, "tp": 0}


def test_link_matmuls_joins_one_shape_across_each_group_of_the_dimension_only(traces, tmp_path):
    document, merged = analyze(traces, tmp_path / "m.json.gz", "--groups", "tp2-dp2", "--link-matmuls", "tp")
    names = track_names(merged)
    flows = chains(merged, "matmul")
    assert {frozenset(ranks_of(chain, names)) for chain in flows.values()} == {frozenset({0, 1}), frozenset({2, 3})}
    assert all(chain[0]["name"].startswith("aten::mm[[64, 64], [64, 64]] #") for chain in flows.values())
    assert document["merged"]["linked_matmuls"] == len(flows) == 2 * RECORDED_STEPS
    unlinked, _ = analyze(traces, tmp_path / "plain.json.gz")
    assert document["merged"]["linked_collectives"] == unlinked["merged"]["linked_collectives"]  # unchanged


@pytest.mark.parametrize(("option", "message"), [
    (("--groups", "tp2-dp4"), "--groups tp2-dp4: the sizes multiply to 8, but the job has 4 ranks"),
    (("--groups", "tp2-xp2"), "unknown dimension 'xp'; known: tp, cp, ep, dp, pp"),
    (("--groups", "tp2-tp2"), "tp is given twice"),
    (("--link-matmuls", "tp"), "--link-matmuls tp: the layout group1(2)-group2(2) (from process groups) has no tp"),
])
def test_a_layout_that_cannot_be_the_jobs_is_one_line_and_exit_2(traces, tmp_path, option, message):
    done = run_cli("analyze", str(traces), "--output", str(tmp_path / "m.json.gz"), *option)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tuiprof analyze: ") and message in done.stderr


def test_dimensions_named_by_their_description_and_ordered_tp_first():
    megatron = {rank: [ProcessGroup("1", "DATA_PARALLEL_GROUP", (rank % 2, rank % 2 + 2)),
                       ProcessGroup("2", "TENSOR_MODEL_PARALLEL_GROUP", (rank // 2 * 2, rank // 2 * 2 + 1))]
                for rank in range(4)}
    layout = layout_from_process_groups(megatron, 4)
    assert layout is not None and layout.describe() == "tp2-dp2 (from process groups)"
    assert layout.label(3) == "tp1 dp1 (rank 3)" and layout.peers(3, "tp") == (1,)
    assert layout_from_process_groups({0: [ProcessGroup("0", "default_pg", (0, 1))]}, 2) is None


def test_groups_spec_is_megatrons_order_first_dimension_fastest():
    layout = layout_from_spec(parse_groups("tp4-cp2-dp4-pp2"), 64, "tp4-cp2-dp4-pp2")
    assert layout.coordinates[45] == {"tp": 1, "cp": 1, "dp": 1, "pp": 1}  # 45 = 1 + 4 * (1 + 2 * (1 + 4 * 1))
    with pytest.raises(GroupsSpecError, match="'tp4x' is not a dimension and its size"):
        parse_groups("tp4x")


def test_worker_threads_are_given_a_communicator_only_when_their_runs_match_the_groups():
    groups = [ProcessGroup("0", "default_pg", (0, 1, 2, 3)), ProcessGroup("2", "", (2, 3))]
    assert thread_groups([101, 100, 120, 121], groups) == {100: "0", 101: "0", 120: "2", 121: "2"}
    assert thread_groups([100, 120, 140], groups) == {}  # three runs, two groups: which is which is not known
    assert thread_groups([100, 120], groups[:1]) == {100: "0", 120: "0"}  # one group: every thread serves it


@pytest.mark.parametrize(("options", "message"), [
    (("--merge", "--groups", "tp2-zz2"), "unknown dimension 'zz'"),
    (("--groups", "tp2-dp2"), "--groups and --link-matmuls lay out the merged timeline; give --merge too"),
])
def test_trace_refuses_a_bad_layout_before_capturing(tmp_path, options, message):
    done = run_cli("trace", "127.0.0.1:1", "--duration-ms", "100", "--output", str(tmp_path / "out"), *options)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # nothing was captured
