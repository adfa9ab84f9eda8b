"""The console's slowdown verdict work at 1024 ranks on 128 hosts, per round of snapshots.

    .venv/bin/python bench/slowdown/scale.py [--hosts 128] [--ranks-per-host 8] [--seconds 30]

Simulated rank streams, shaped as agents report them: every host's snapshot each second, each
rank in two communicators (a data-parallel one across all ranks, a tensor-parallel one within its
host) with 40 collectives a second in each, sampled as ``rank_arrivals`` samples them (at most
MAX_ARRIVALS_PER_COMM per communicator and interval). One rank is late from second 10. Timed:
``ClusterSlowdowns.observe`` over all hosts, once per round (what the console runs per batch of
snapshots), after the wire messages are built (the console receives them built).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from agentd.collectors.rank_arrivals import ArrivalTracker
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import slowdown_cause
from tuiprof.analysis.slowdown import ClusterSlowdowns
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import SnapshotReceived

COLLECTIVES_PER_S = 40
STEP_S = 0.2
LATE_S = 0.04


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    ranks = args.hosts * args.ranks_per_host
    late_rank = ranks - 3
    rng = random.Random(1)
    trackers = [ArrivalTracker() for _ in range(ranks)]
    cluster, judged = ClusterState([]), ClusterSlowdowns()
    seq, times, t0 = 0, [], 1_795_000_000.0
    verdict = None
    for second in range(args.seconds):
        late = LATE_S if second >= 10 else 0.0
        starts: list[list[tuple[str, int, int, bool]]] = [[] for _ in range(ranks)]
        ends = [int((t0 + second + k * STEP_S) * 1e9) for k in range(1, int(1 / STEP_S) + 1)]
        for k in range(COLLECTIVES_PER_S):
            seq += 1
            base = t0 + second + k / COLLECTIVES_PER_S
            first_of_step = k % int(COLLECTIVES_PER_S * STEP_S) == 0
            for r in range(ranks):
                delay = late if r == late_rank and first_of_step else 0.0
                start = int((base + delay + rng.uniform(0, 2e-4)) * 1e9)
                starts[r].append(("dp0", seq, start, False))
                starts[r].append((f"tp{r // args.ranks_per_host}", seq, start, False))
        events = []
        for host in range(args.hosts):
            snapshot = pb.HostSnapshot(hostname=f"node{host:03d}", timestamp_unix_ns=int((t0 + second + 1) * 1e9),
                                       sequence=second + 1)
            for local in range(args.ranks_per_host):
                r = host * args.ranks_per_host + local
                rank = snapshot.ranks.add(pid=1000 + local, rank=r, job_id="bench", state=pb.RANK_STATE_RUNNING,
                                          step_count=int((second + 1) / STEP_S))
                rank.arrivals.extend(trackers[r].take(starts[r], ranks))
                rank.step_ends_unix_ns.extend(ends)
            events.append(SnapshotReceived(host=f"node{host:03d}:1779", at=t0 + second + 1, message=snapshot))
        for event in events:
            cluster.apply(event)
        started = time.perf_counter()
        (verdict,) = judged.observe(cluster.hosts(), cluster.now)
        times.append(time.perf_counter() - started)
    arrivals = sum(len(c.sequence) for state in cluster.hosts() if state.message
                   for r in state.message.ranks for c in r.arrivals)
    ordered = sorted(times)
    print(f"{ranks} ranks on {args.hosts} hosts, {arrivals} arrivals in the last round: observe median "
          f"{statistics.median(times) * 1e3:.1f} ms, p90 {ordered[int(0.9 * len(ordered))] * 1e3:.1f} ms, "
          f"max {ordered[-1] * 1e3:.1f} ms (round {times.index(ordered[-1]) + 1}) over {len(times)} rounds")
    assert verdict is not None
    print(f"verdict: slow={verdict.slow} culprits={[(c.rank, c.host) for c in verdict.culprits]} "
          f"cost={verdict.cost_seconds * 1e3:.1f} ms/step (truth {LATE_S * 1e3:.1f}) cause={slowdown_cause(verdict.cause)}")


if __name__ == "__main__":
    main()
