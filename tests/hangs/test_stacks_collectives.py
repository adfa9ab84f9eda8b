from agentd.stacks import ranksets
from agentd.stacks.collectives import Inflight, RankCollectives, behind, findings

COMM = "3fa1c0ffee"


def waiting(rank, seq=1042, age=312.0):
    return RankCollectives(rank, (Inflight("all_reduce", COMM, seq, age),), frozenset({COMM}))


def test_the_rank_that_never_launched_is_named():
    ranks = [waiting(r) for r in (0, 1, 3)] + [RankCollectives(2, (), frozenset({COMM}))]
    assert findings(ranks) == {2: "never launched all_reduce #1042 on comm 3fa1… (ranks 0-1,3 launched it)"}


def test_a_rank_stuck_in_an_older_collective_is_behind():
    ranks = [waiting(0), waiting(1), waiting(2, seq=1041)]
    assert findings(ranks) == {2: "is at all_reduce #1041, behind all_reduce #1042 on comm 3fa1… (ranks 0-1 launched it)"}


def test_everyone_in_the_same_collective_is_a_stuck_collective_not_a_missing_rank():
    out = findings([waiting(r, age=300 + r) for r in range(3)])
    assert set(out) == {0, 1, 2}
    assert out[0] == "launched all_reduce #1042 on comm 3fa1… 300 s ago and it has not finished on any member"


def test_ranks_outside_the_communicator_are_not_blamed():
    ranks = [waiting(0), waiting(1), RankCollectives(2, (), frozenset({"other"}))]
    out = findings(ranks)
    assert 2 not in out
    assert set(out) == {0, 1} and "not finished on any member" in out[0]


def test_nothing_in_flight_says_nothing():
    assert findings([RankCollectives(r, (), frozenset({COMM})) for r in range(4)]) == {}


def test_behind_names_the_ranks_that_never_launched_or_lag_not_the_waiting_ones():
    missing = [waiting(r) for r in (0, 1, 3)] + [RankCollectives(2, (), frozenset({COMM}))]
    assert ranksets.fold(behind(missing)) == "2"
    lagging = [waiting(0), waiting(1, seq=1041), waiting(2, seq=1040)]
    assert ranksets.fold(behind(lagging)) == "1-2"
    assert behind([waiting(r) for r in range(3)]) == 0  # a stuck collective: nobody is behind
