"""The verdict's join of arrivals (``verdict._join``: grouped by the sequence numbers ranks reported, a
collective taken as a column) against the join as the verdict defines it, on random arrival streams.

The definition, written the plain way: every arrival ever reported is kept; a collective settles in
the round after which at least two ranks reported it and every rank seen reporting in its
communicator did; it is charged to the last to start, its start minus the runner-up's. The streams
have what the fast path must not get wrong: ranks whose report comes a round or two late (then
a communicator's ranks report different collectives in one round), collectives a rank never
reports, a rank first seen in a communicator only later, ties. Nothing here outlives the window
or the settle time, which the reference leaves out."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.slowdown import verdict as v
from agentd.slowdown.feeds import RankFeed

Arrival = tuple[int, str, int, int]  # (rank, communicator, sequence number, start)
Charge = tuple[str, int, float, int | None, float]  # (comm, seq, latest start, rank charged or None, held ns)


def random_rounds(rng: random.Random, ranks: int = 12, rounds: int = 8) -> list[list[Arrival]]:
    """What each rank reports each round: every collective of the round in each of its communicators
    (one across all ranks, one per four), some a round or two late, a few never."""
    comms = {rank: ("all", f"group{rank // 4}") for rank in range(ranks)}
    backlog: dict[int, list[Arrival]] = defaultdict(list)
    reported = []
    for round_number in range(rounds):
        now = []
        for rank in range(ranks):
            for seq in range(round_number * 6, round_number * 6 + 6):
                for comm in comms[rank]:
                    if rank == ranks - 1 and comm == "all" and round_number < 2:
                        continue  # first seen in "all" in the third round
                    if rng.random() > 0.03:
                        backlog[rank].append((rank, comm, seq, rng.randrange(1_000, 1_040)))  # ties too
            if rng.random() < 0.7 or round_number == rounds - 1:
                now += backlog.pop(rank, [])
        reported.append(now)
    return reported


def reference_charges(rounds: list[list[Arrival]]) -> list[set[Charge]]:
    starts: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    members: dict[str, set[int]] = defaultdict(set)
    settled: set[tuple[str, int]] = set()
    charges = []
    for arrivals in rounds:
        for rank, comm, seq, start in arrivals:
            starts[comm, seq][rank] = start
            members[comm].add(rank)
        charged: set[Charge] = set()
        for comm, seq in {(comm, seq) for _, comm, seq, _ in arrivals} - settled:
            by_rank = starts[comm, seq]
            if len(by_rank) >= 2 and members[comm] <= by_rank.keys():
                settled.add((comm, seq))
                runner_up, latest = sorted(by_rank.values())[-2:]
                last = [rank for rank, start in by_rank.items() if start == latest]
                charged.add((comm, seq, latest, last[0] if latest > runner_up else None, latest - runner_up))
        charges.append(charged)
    return charges


def join_charges(rounds: list[list[Arrival]]) -> list[set[Charge]]:
    job = v._Job()
    charges = []
    for now, arrivals in enumerate(rounds):
        by_rank: dict[int, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
        for rank, comm, seq, start in arrivals:
            by_rank[rank][comm].append((seq, start))
        feeds = [RankFeed(pid=rank, rank=rank, host="node", job_id="job", state=pb.RANK_STATE_RUNNING, step_count=0,
                          arrivals=[pb.CollectiveArrivals(comm=comm, sequence=[seq for seq, _ in reported],
                                                          start_unix_ns=[start for _, start in reported])
                                    for comm, reported in sorted(by_rank[rank].items())])
                 for rank in range(12)]
        v._join(job, feeds, float(now))
        pid_of = {rid: pid for (_, pid), rid in job.ids.items()}
        # A tie for last charges nobody anything: which of the tied ranks the join names is not compared.
        charges.append({(comm, seq, latest, pid_of[rid] if held else None, held)
                        for comm, joined in job.joined.items()
                        for when, seq, latest, rid, held in joined if when == now})
    return charges


@pytest.mark.parametrize("seed", range(20))
def test_the_join_charges_what_the_definition_charges(seed: int) -> None:
    rounds = random_rounds(random.Random(seed))
    expected = reference_charges(rounds)
    assert join_charges(rounds) == expected
    assert sum(map(len, expected)) > 100  # the streams do settle collectives
