"""Timelines by parallel group (issue 30 item 3): a real four-rank gloo job with two families of process groups,
merged by `tuiprof analyze`, laid out by the groups the traces list or by --groups; every collective linked within
its communicator, and no link across communicators, in the merge and in the agents' summaries; same-shape matmuls
linked across one dimension's groups on request."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections import defaultdict

import msgspec
import pytest

from agentd.traces.analysis.process_groups import ProcessGroup, gloo_thread_groups, process_groups
from agentd.traces.analysis.summarise import summarise_file
from testkit.ports import free_port
from testkit.traces import run_cli
from tuiprof.analysis.parallel_groups import GroupsSpecError, layout_from_process_groups, layout_from_spec, parse_groups
from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_reduce import RemoteRank, reduce_summaries
from tuiprof.analysis.trace_summary import summarize, summary_json
from tuiprof.model import convert
from tuiprof.model.messages import RankTraceSummary

JOB = pathlib.Path(__file__).parent / "gloo_groups_job.py"
# The same job traced once and checked in (its README: how; rank 0's worker thread ids are not consecutive).
TRACED = pathlib.Path(__file__).parent / "data" / "gloo_groups"
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


def assert_every_collective_linked_within_its_communicator(traces: pathlib.Path, output: pathlib.Path) -> None:
    document, merged = analyze(traces, output)
    assert document["merged"]["groups"] == "group1(2)-group2(2) (from process groups)"
    names = track_names(merged)
    cpu = sorted(name for name in names.values() if "CPU pid" in name)
    assert [name.split(" ·")[0] for name in cpu] == ["group1=0 group2=0 (rank 0)", "group1=0 group2=1 (rank 2)",
                                                     "group1=1 group2=0 (rank 1)", "group1=1 group2=1 (rank 3)"]
    linked: dict[str, list[set[int]]] = defaultdict(list)
    for chain in chains(merged, "collective").values():
        linked[re.search(r" on group (\S+)$", chain[0]["name"]).group(1)].append(ranks_of(chain, names))
    # Each step all-reduces once on each group: every call is linked, each chain through its group's ranks only.
    assert linked == {group: [ranks] * RECORDED_STEPS for group, ranks in COMMUNICATORS.items()}
    assert document["merged"]["linked_collectives"] == len(COMMUNICATORS) * RECORDED_STEPS


def test_a_fresh_jobs_process_groups_lay_the_ranks_out_and_link_each_collective_within_its_communicator(
        traces, tmp_path):
    assert_every_collective_linked_within_its_communicator(traces, tmp_path / "m.json.gz")


def test_the_checked_in_jobs_collectives_are_all_linked_though_its_worker_thread_ids_interleave(tmp_path):
    assert_every_collective_linked_within_its_communicator(TRACED, tmp_path / "m.json.gz")


def test_agents_summaries_pair_gloo_collectives_within_their_communicator(trace_dir, tmp_path):
    # Each rank summarised where it was written, as its agent does; the console pairs the calls from the columns.
    folder = trace_dir.user_folder(os.getuid())
    ranks = []
    for rank in range(4):
        name = f"rank{rank}.json.gz"
        shutil.copy(TRACED / name, trace_dir.path / folder / name)
        summary = summarise_file(trace_dir, f"{folder}/{name}", "node", 100 + rank, None)
        assert {(c.group, len(c.start_us)) for c in summary.collectives} == {
            (group, RECORDED_STEPS) for group, members in COMMUNICATORS.items() if rank in members}
        ranks.append(RemoteRank("node", 100 + rank, None, f"{folder}/{name}",
                                convert.from_proto(RankTraceSummary, summary)))
    reduced = summary_json(reduce_summaries(ranks).summary)
    assert reduced["collectives_compared"] == len(COMMUNICATORS) * RECORDED_STEPS
    assert {skew["group"] for skew in reduced["worst_collectives"]} == set(COMMUNICATORS)
    merged = merge_traces([TraceInput(TRACED / f"rank{rank}.json.gz", "node", None, 100 + rank) for rank in range(4)],
                          tmp_path / "m.json.gz", workers=1, timeline=False)
    from_files = summary_json(summarize(merged.ranks))
    for document in (reduced, from_files):
        for rank in document["ranks"]:
            rank.pop("file")
    assert reduced == from_files  # the same figures as the merge of the files


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


def test_worker_threads_serve_the_groups_in_the_order_made_when_every_group_shows_its_threads():
    groups = [ProcessGroup("0", "default_pg", (0, 1, 2, 3)), ProcessGroup("2", "", (2, 3)),
              ProcessGroup("5", "", (1, 2), gloo=False), ProcessGroup("7", "", (0, 2))]  # 5: NCCL's alone
    # Ids need not be consecutive: other processes make threads at the same moments.
    assert gloo_thread_groups([141, 101, 100, 120, 123, 140], groups) == {
        100: "0", 101: "0", 120: "2", 123: "2", 140: "7", 141: "7"}
    # Four a group: two network devices.
    assert gloo_thread_groups(range(12), groups) == {t: ("0", "2", "7")[t // 4] for t in range(12)}
    # A thread that ran nothing: where each group's threads begin is not known.
    assert gloo_thread_groups([100, 101, 120, 140, 141], groups) == {}
    assert gloo_thread_groups([100, 120, 140], groups[:1]) == {100: "0", 120: "0", 140: "0"}  # one group: all its


def test_process_groups_say_which_gloo_serves():
    listed = msgspec.Raw(json.dumps([
        {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:nccl", "ranks": [1, 0]},
        {"pg_name": "1", "pg_desc": "", "backend_config": "cuda:nccl", "ranks": [0, 1]},
        {"pg_name": "2", "pg_desc": "", "ranks": "0,1"}]).encode())
    assert process_groups(listed) == [ProcessGroup("0", "default_pg", (0, 1)), ProcessGroup("1", "", (0, 1), gloo=False),
                                      ProcessGroup("2", "", ())]  # no backend said: gloo may serve it


@pytest.mark.parametrize(("options", "message"), [
    (("--merge", "--groups", "tp2-zz2"), "unknown dimension 'zz'"),
    (("--groups", "tp2-dp2"), "--groups and --link-matmuls lay out the merged timeline; give --merge too"),
])
def test_trace_refuses_a_bad_layout_before_capturing(tmp_path, options, message):
    done = run_cli("trace", "127.0.0.1:1", "--duration-ms", "100", "--output", str(tmp_path / "out"), *options)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # nothing was captured
