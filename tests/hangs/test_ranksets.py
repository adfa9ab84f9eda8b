from itertools import pairwise

import pytest
from hypothesis import given, settings, strategies as st

from agentd.stacks import ranksets

# A loaded CI machine must not turn slowness into failures.
NO_DEADLINE = settings(deadline=None)

rank_lists = st.lists(st.integers(min_value=0, max_value=5000), max_size=200)


@NO_DEADLINE
@given(rank_lists)
def test_fold_round_trips(ranks):
    text = ranksets.fold(ranks)
    assert ranksets.parse(text) == sorted(set(ranks))
    assert ranksets.fold(ranksets.mask_of(ranks)) == text


@NO_DEADLINE
@given(rank_lists)
def test_fold_is_minimal(ranks):
    # every part is a maximal run: consecutive parts never touch
    parts = [p for p in ranksets.fold(ranks).split(",") if p]
    ends = [(int(p.split("-")[0]), int(p.split("-")[-1])) for p in parts]
    for (_, end), (start, _) in pairwise(ends):
        assert start > end + 1


def test_examples():
    assert ranksets.fold([5, 0, 1, 2, 3, 7, 6, 5]) == "0-3,5-7"
    assert ranksets.fold([]) == ""
    assert ranksets.parse(" 0-2, 9 ") == [0, 1, 2, 9]
    assert ranksets.ranks_of(0b1011) == [0, 1, 3]


@pytest.mark.parametrize("bad", ["1-", "a", "3-1", "1,,2", "-1"])
def test_bad_text_is_named(bad):
    with pytest.raises(ranksets.RankSetError, match="rank range"):
        ranksets.parse(bad)


def test_negative_rank_refused():
    with pytest.raises(ranksets.RankSetError, match="negative"):
        ranksets.mask_of([-1])


def test_fold_short_cuts_at_a_comma():
    scattered = list(range(0, 400, 3))
    short = ranksets.fold_short(scattered, 20)
    assert short.endswith(",…") and len(short) <= 22
    assert ranksets.fold(scattered).startswith(short[:-2])
    assert ranksets.fold_short([1, 2, 3]) == "1-3"
    assert ranksets.fold_short([1000, 1001, 2000], 4) == "1000-1001,…"
