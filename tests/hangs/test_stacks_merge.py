"""The merge is a pure function: properties that must hold for any input."""

from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

from agentd.stacks import ranksets
from agentd.stacks.merge import (
    Frame,
    MergedStacks,
    ThreadSample,
    equivalence_classes,
    find_suspects,
    merge,
    merge_trees,
    normalize_frames,
    project,
    without_lines,
)
from agentd.stacks.wire import tree_from_proto, tree_to_proto

# A loaded CI machine must not turn slowness into failures.
NO_DEADLINE = settings(deadline=None)

frames = st.builds(
    Frame,
    function=st.sampled_from(["main", "train", "all_reduce", "wait", "sleep", "step"]),
    file=st.sampled_from(["train.py", "c10d.py"]),
    line=st.integers(0, 3),
    native=st.booleans(),
).map(lambda f: f._replace(line=0, file="libc.so.6") if f.native else f)
stacks = st.lists(frames, max_size=8).map(tuple)


@st.composite
def samples(draw):
    ranks = draw(st.lists(st.integers(0, 300), min_size=1, max_size=24, unique=True))
    out = []
    for rank in ranks:
        for thread in draw(st.lists(st.sampled_from(["MainThread", "pt_worker", "gc"]), min_size=1, unique=True)):
            out.append(ThreadSample(rank, thread, draw(stacks)))
    return out


def canonical(merged: MergedStacks):
    def node(n):
        return (n.frame, n.ranks, tuple(sorted((node(c) for c in n.children.values()), key=repr)))
    return merged.ranks, tuple(sorted((t, node(r)) for t, r in merged.threads.items()))


@NO_DEADLINE
@given(samples(), st.randoms())
def test_merge_is_order_independent(items, rnd):
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert canonical(merge(shuffled)) == canonical(merge(items))


@NO_DEADLINE
@given(samples(), st.integers(1, 5), st.randoms())
def test_merging_host_trees_equals_merging_all_stacks(items, hosts, rnd):
    parts = [[] for _ in range(hosts)]
    for item in items:  # one rank's threads may even land on different hosts
        rnd.choice(parts).append(item)
    trees = [merge(p) for p in parts]
    rnd.shuffle(trees)
    assert canonical(merge_trees(trees)) == canonical(merge(items))


@NO_DEADLINE
@given(samples())
def test_every_rank_is_in_exactly_one_class_with_its_own_stack(items):
    merged = merge(items)
    for thread in merged.threads:
        classes = equivalence_classes(merged, thread)
        union = 0
        for c in classes:
            assert union & c.ranks == 0, "a rank in two classes"
            union |= c.ranks
        expected = {s.rank: s.frames for s in items if s.thread == thread}
        assert union == ranksets.mask_of(expected)
        for c in classes:
            for rank in ranksets.ranks_of(c.ranks):
                assert c.frames == expected[rank]
        counts = [c.count for c in classes]
        assert counts == sorted(counts)


@NO_DEADLINE
@given(samples())
def test_node_ranks_are_the_children_and_the_stacks_ending_here(items):
    merged = merge(items)
    for root in merged.threads.values():
        pending = [root]
        while pending:
            node = pending.pop()
            below = 0
            for child in node.children.values():
                assert child.ranks & ~node.ranks == 0
                below |= child.ranks
                pending.append(child)
            assert node.ranks == below | node.ending()
            assert merged.missing(node) == merged.ranks & ~node.ranks


@NO_DEADLINE
@given(samples(), st.booleans(), st.booleans())
def test_projecting_a_tree_equals_merging_projected_stacks(items, lines, native):
    def coarse(fs):
        return tuple((f if lines else without_lines(f)) for f in fs if native or not f.native)
    direct = merge(ThreadSample(s.rank, s.thread, coarse(s.frames)) for s in items)
    assert canonical(project(merge(items), lines=lines, native=native)) == canonical(direct)


@settings(max_examples=50, deadline=None)
@given(samples())
def test_proto_round_trip(items):
    merged = merge(items)
    assert canonical(tree_from_proto(tree_to_proto(merged))) == canonical(merged)


def raw(function, file="", line=0, native=False, module=""):
    return SimpleNamespace(function=function, file=file, line=line, native=native, module=module)


def test_normalize_strips_addresses_and_interpreter_frames():
    lib = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    py = "/opt/py/lib/libpython3.11.so.1.0"
    out = normalize_frames([
        raw("0x7f05df84524a", "libc.so.6", native=True, module=lib),
        raw("0x7f05df8a71f5", "libc.so.6", native=True, module=lib),
        raw("Py_BytesMain", native=True, module=py),
        raw("<module>", "/job/train.py", 7),
        raw("_PyEval_EvalFrameDefault", native=True, module=py),
        raw("_PyObject_MakeTpCall", native=True, module=py),
        raw("stuck_here", "/job/train.py", 3),
        raw("time_sleep", native=True, module=py),
        raw("clock_nanosleep+0x1f", native=True, module=lib),
    ])
    assert out == (
        Frame("??", "libc.so.6", 0, True),
        Frame("<module>", "/job/train.py", 7),
        Frame("stuck_here", "/job/train.py", 3),
        Frame("time_sleep", "libpython3.11.so.1.0", 0, True),
        Frame("clock_nanosleep", "libc.so.6", 0, True),
    )


def _job(stacks_by_rank):
    return merge(ThreadSample(r, "MainThread", tuple(Frame(f, "train.py") for f in fs)) for r, fs in stacks_by_rank.items())


def test_the_odd_rank_is_the_suspect():
    merged = _job(dict.fromkeys((0, 1, 3, 4, 5, 6, 7), ("main", "all_reduce")) | {2: ("main", "stuck_here")})
    classes = equivalence_classes(merged)
    assert [(ranksets.fold(c.ranks), c.count) for c in classes] == [("2", 1), ("0-1,3-7", 7)]
    (suspect,) = find_suspects(classes)
    assert ranksets.fold(suspect.ranks) == "2"
    assert "stuck_here" in suspect.reason and "0-1,3-7" in suspect.reason


def test_collective_finding_leads_the_reason():
    merged = _job({0: ("main", "all_reduce"), 1: ("main", "all_reduce"), 2: ("main", "__next__")})
    (suspect,) = find_suspects(equivalence_classes(merged), {2: "never launched all_reduce #1042"})
    assert suspect.reason.startswith("rank 2 never launched all_reduce #1042; it is in `__next__")


def test_collectives_name_the_suspect_where_class_sizes_cannot():
    two = _job({0: ("main", "all_reduce"), 1: ("main", "skip_and_sleep")})
    assert find_suspects(equivalence_classes(two)) == []  # 1 against 1: the stacks alone cannot say
    (suspect,) = find_suspects(equivalence_classes(two), {1: "never launched AllReduce #120"}, behind=0b10)
    assert ranksets.fold(suspect.ranks) == "1"
    assert suspect.reason == "rank 1 never launched AllReduce #120; it is in `skip_and_sleep (train.py)` " \
                             "(rank 0 is in `all_reduce (train.py)`)"
    half = _job({0: ("main", "all_reduce"), 1: ("main", "all_reduce"), 2: ("main", "load"), 3: ("main", "load")})
    (suspect,) = find_suspects(equivalence_classes(half), {}, behind=0b1100)
    assert ranksets.fold(suspect.ranks) == "2-3" and "`load (train.py)`" in suspect.reason


def test_every_rank_behind_is_no_evidence_against_any():
    even = _job({0: ("main", "a"), 1: ("main", "a"), 2: ("main", "b"), 3: ("main", "b")})
    assert find_suspects(equivalence_classes(even), {}, behind=0b1111) == []


def test_no_suspect_when_everyone_waits_in_the_same_place_or_splits_evenly():
    assert find_suspects(equivalence_classes(_job(dict.fromkeys(range(4), ("main", "barrier"))))) == []
    even = _job({0: ("main", "a"), 1: ("main", "a"), 2: ("main", "b"), 3: ("main", "b")})
    assert find_suspects(equivalence_classes(even)) == []
    spread = _job({0: ("main", "a"), 1: ("main", "a"), 2: ("main", "b"), 3: ("main", "c"), 4: ("main", "d")})
    assert find_suspects(equivalence_classes(spread)) == []


def test_duplicate_thread_names_get_their_own_group():
    merged = merge([
        ThreadSample(0, "worker", (Frame("a", "x.py"),)),
        ThreadSample(0, "worker", (Frame("b", "x.py"),)),
    ])
    assert sorted(merged.threads) == ["worker", "worker [2]"]
    assert merged.main_thread() == "worker"
