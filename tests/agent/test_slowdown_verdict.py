"""The slowdown verdict on scripted rank streams: who, what it costs, why; and no verdict on noise.

The streams are what the ranks collector reports each second: per rank its step count,
its collectives' starts (a sample, as ``rank_arrivals`` takes it) and its rates. Real jobs
drive the same judge in tests/hangs/test_slowdown_gloo.py."""

from __future__ import annotations

import dataclasses
import pathlib
import random
import re

import pytest

from agentd.collectors.rank_arrivals import ArrivalTracker
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import slowdown_cause, words
from agentd.slowdown import verdict as v
from agentd.slowdown.feeds import GpuFeed, RankFeed

STEP_S = 0.1
COLLECTIVES_PER_STEP = 4


class Job:
    """``ranks`` ranks stepping every STEP_S (plus ``late[rank]`` s for the late one), one snapshot a second."""

    def __init__(self, ranks: int = 4, job_id: str = "job", seed: int = 0) -> None:
        self.ranks, self.job_id = ranks, job_id
        self.random = random.Random(seed)
        self.seconds, self.steps, self.seq = 0, 0, 0
        self.late: dict[int, float] = {}
        self.gap_after_wait: dict[int, float] = {}  # rank → how much later than the others it starts the rest
        self.phase: dict[int, float] = {}  # rank → how much later it starts every collective, the step unchanged
        self.extra_step_s = 0.0
        self.signals: dict[int, dict[str, float]] = {}
        self.states: dict[int, pb.RankState] = {}
        self.comm_s_per_s = 0.2
        self.gpus: dict[int, GpuFeed] = {}
        self.gemm: dict[int, float] = {}
        self.trackers = [ArrivalTracker() for _ in range(ranks)]

    def second(self) -> list[RankFeed]:
        """One second of the job: its ranks' feeds for the snapshot that follows it."""
        step_s = STEP_S + max(self.late.values(), default=0.0) + self.extra_step_s
        starts: list[list[tuple[str, int, int, bool]]] = [[] for _ in range(self.ranks)]
        t = self.seconds * 1e9
        steps, ends = 0, []
        while t < (self.seconds + 1) * 1e9:
            # a late rank reaches the step's first collective late; the others wait in it, so the
            # step's later collectives find everyone together again
            for collective in range(COLLECTIVES_PER_STEP):
                self.seq += 1
                for rank in range(self.ranks):
                    late = self.late.get(rank, 0.0) if collective == 0 else self.gap_after_wait.get(rank, 0.0)
                    late += self.phase.get(rank, 0.0)
                    jitter = self.random.uniform(0, 0.0005)
                    starts[rank].append(("c0ffee", self.seq, int(t + (late + jitter) * 1e9), False))
                t += step_s / COLLECTIVES_PER_STEP * 1e9
            steps += 1
            ends.append(int(t))
        self.steps += steps
        self.seconds += 1
        feeds = []
        for rank in range(self.ranks):
            sample = self.trackers[rank].take(starts[rank], self.ranks)
            signals = dict.fromkeys(v.SIGNALS, 0.0)
            signals.update(self.signals.get(rank, {}))
            feeds.append(RankFeed(
                pid=1000 + rank, rank=rank, host="node1", job_id=self.job_id, state=self.states.get(rank, pb.RANK_STATE_RUNNING),
                step_count=self.steps,
                arrivals=sample, step_ends=ends,
                signals=signals, gemm_seconds={"gemm bf16 m=4096": self.gemm.get(rank, 0.001)},
                comm_seconds_per_s=self.comm_s_per_s, gpu=self.gpus.get(rank)))
        return feeds


def run(judge: v.SlowdownJudge, clock: list[float], job: Job, seconds: int):
    verdicts = []
    for _ in range(seconds):
        clock[0] += 1.0
        verdicts = judge.observe(job.second())
    return verdicts


@pytest.fixture
def judged():
    clock = [0.0]
    return v.SlowdownJudge(clock=lambda: clock[0], wall_clock_ns=lambda: int(clock[0] * 1e9)), clock


def test_a_healthy_job_with_jittery_arrivals_is_not_slow(judged):
    judge, clock = judged
    job = Job()
    for _ in range(120):
        (verdict,) = run(judge, clock, job, 1)
        assert not verdict.slow and not verdict.culprits and slowdown_cause(verdict.cause) == ""
    assert len(verdict.ranks) == 4 and verdict.step_seconds == pytest.approx(STEP_S, rel=0.1)


def test_the_late_rank_is_named_with_its_cost_within_seconds(judged):
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 10)
    job.late[2] = 0.03  # rank 2 reaches each collective 30 ms after the others
    verdicts = [run(judge, clock, job, 1)[0] for _ in range(4)]  # one a second
    verdict = next((verdict for verdict in verdicts if verdict.slow), None)
    assert verdict is not None, "not named slow within 4 s"
    assert [c.rank for c in verdict.culprits] == [2]
    (verdict,) = run(judge, clock, job, int(v.WINDOW_S))  # a window of the slow job alone
    # the others wait 30 ms a step for it (its sampled collectives weighed by their sample), in a 130 ms step
    assert verdict.culprits[0].cost_seconds == pytest.approx(0.03, rel=0.25)
    assert verdict.cost_percent == pytest.approx(100 * 0.03 / (STEP_S + 0.03), rel=0.25)
    assert verdict.step_seconds == pytest.approx(STEP_S + 0.03, rel=0.1)
    assert slowdown_cause(verdict.cause) == "unknown" and "checked, and like its peers in each" in verdict.evidence[-1]
    job.late.clear()
    (verdict,) = run(judge, clock, job, int(v.WINDOW_S) + v.CLEAR_SNAPSHOTS + 1)
    assert not verdict.slow


def test_a_late_ranks_cost_is_at_most_the_steps_rise_over_its_healthy_baseline(judged):
    """DDP's buckets: once the others waited for the late rank at the step's first all-reduce, they start
    each later one as soon as it can begin, while the late rank starts it when its backward pass has
    produced it. Those gaps are in the healthy step too; summed they would charge the late rank twice
    its real cost (30 ms + 3 × 10 ms). With a healthy baseline the cost is the step's rise; a job late
    from its start has no baseline to bound it."""
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 10)
    job.late[2], job.gap_after_wait[2] = 0.03, 0.01
    (verdict,) = run(judge, clock, job, int(v.WINDOW_S) + 1)
    assert verdict.slow and [c.rank for c in verdict.culprits] == [2]
    assert verdict.culprits[0].cost_seconds == pytest.approx(0.03, rel=0.15)
    waited_ms = float(re.search(r"at collectives: ([0-9.]+) ms per step", verdict.evidence[0]).group(1))
    assert waited_ms == pytest.approx(60, rel=0.15) and verdict.evidence[1].startswith("the step grew ")

    judge, clock = v.SlowdownJudge(clock=lambda: clock[0], wall_clock_ns=lambda: int(clock[0] * 1e9)), clock
    late_from_the_start = Job(job_id="other")
    late_from_the_start.late[2], late_from_the_start.gap_after_wait[2] = 0.03, 0.01
    (verdict,) = run(judge, clock, late_from_the_start, int(v.WINDOW_S) + 1)
    assert verdict.slow and not verdict.HasField("baseline_step_seconds")
    assert verdict.culprits[0].cost_seconds == pytest.approx(0.06, rel=0.15)
    assert not any("the step grew" in line for line in verdict.evidence)


def test_a_rank_late_at_every_collective_while_the_step_stays_as_when_healthy_costs_nothing(judged):
    """A rank whose compute keeps a constant phase behind its peers' starts every collective late (DDP with
    its step timer's sync, 2 ranks on 2 H200s: 36 of 40 snapshots of a healthy job named its rank 0 at 22 %);
    the step is what it was when healthy, so it costs the job nothing: no verdict, its cost bounded to the
    step's rise. A job with that phase from its start has no healthy baseline: named (the case above)."""
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 10)
    job.phase[1] = 0.006  # 4 collectives a step: 24 ms of a 100 ms step by the sum
    for _ in range(int(v.WINDOW_S) * 3):
        (verdict,) = run(judge, clock, job, 1)
        assert not verdict.slow, verdict.evidence
    assert verdict.step_seconds == pytest.approx(STEP_S, rel=0.05) and verdict.HasField("baseline_step_seconds")
    (costliest, *_) = verdict.ranks
    assert costliest.rank == 1 and costliest.cost_percent < 100 * v.COST_MIN_FRACTION

    judge, clock = v.SlowdownJudge(clock=lambda: clock[0], wall_clock_ns=lambda: int(clock[0] * 1e9)), clock
    unbounded = Job(job_id="other")
    unbounded.phase[1] = 0.006
    (verdict,) = run(judge, clock, unbounded, int(v.WINDOW_S) + 1)
    assert verdict.slow and [c.rank for c in verdict.culprits] == [1]
    assert verdict.culprits[0].cost_seconds == pytest.approx(0.024, rel=0.2)


@pytest.mark.parametrize(("signal", "cause"), [
    ("gc_pause_seconds_per_s", "gc_pauses"),
    ("dataloader_wait_seconds_per_s", "input_pipeline"),
    ("run_delay_seconds_per_s", "cpu_starved"),
    ("cpu_throttled_seconds_per_s", "cpu_starved"),
])
def test_the_cause_is_the_signal_that_sets_the_rank_apart(judged, signal, cause):
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 10)
    job.late[1] = 0.03
    job.signals[1] = {signal: 0.2}
    (verdict,) = run(judge, clock, job, 5)
    assert verdict.slow and slowdown_cause(verdict.cause) == cause and verdict.culprits[0].rank == 1
    assert any("200 ms per second against 0 ms" in line for line in verdict.evidence)


def test_a_stopped_rank_is_named_stopped(judged):
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 10)
    job.late[3] = 0.03
    job.states[3] = pb.RANK_STATE_STOPPED
    run(judge, clock, job, 1)
    job.states[3] = pb.RANK_STATE_RUNNING
    (verdict,) = run(judge, clock, job, 4)
    assert slowdown_cause(verdict.cause) == "stopped" and verdict.culprits[0].rank == 3


def test_another_process_on_its_gpu_then_slower_gemms(judged):
    judge, clock = judged
    job = Job()
    job.gpus = {r: GpuFeed(index=r, sm_clock_hz=1.98e9, processes=((1000 + r, 90.0),)) for r in range(4)}
    run(judge, clock, job, 10)
    job.late[0] = 0.03
    job.gpus[0] = GpuFeed(index=0, sm_clock_hz=1.98e9, processes=((1000, 50.0), (4242, 45.0)))
    (verdict,) = run(judge, clock, job, 5)
    assert slowdown_cause(verdict.cause) == "gpu_contention" and "pid 4242 (45 % SM)" in " ".join(verdict.evidence)
    assert verdict.culprits[0].gpu == 0
    job.gpus[0] = GpuFeed(index=0, sm_clock_hz=1.2e9, power_limit_watts=300.0, processes=((1000, 99.0),))
    job.gemm[0] = 0.0016
    (verdict,) = run(judge, clock, job, 3)
    assert slowdown_cause(verdict.cause) == "gpu_slower"
    text = " ".join(verdict.evidence)
    assert "1600 µs against 1000 µs" in text and "1200 MHz against 1980 MHz" in text


def test_a_step_that_grows_with_nccl_time_and_no_late_rank_is_slow_communication(judged):
    judge, clock = judged
    job = Job()
    run(judge, clock, job, 20)
    job.extra_step_s = 0.05
    job.comm_s_per_s = 0.5
    (verdict,) = run(judge, clock, job, 8)
    assert verdict.slow and slowdown_cause(verdict.cause) == "slow_communication" and not verdict.culprits
    assert verdict.cost_seconds == pytest.approx(0.05, rel=0.2)


def test_two_jobs_on_one_host_are_judged_apart(judged):
    judge, clock = judged
    a, b = Job(job_id="a"), Job(job_id="b", seed=1)
    b.late[1] = 0.03
    verdicts = []
    for _ in range(15):
        clock[0] += 1.0
        verdicts = judge.observe(a.second() + [dataclasses.replace(f, pid=f.pid + 100) for f in b.second()])
    by_job = {verdict.job_id: verdict for verdict in verdicts}
    assert not by_job["a"].slow
    assert by_job["b"].slow and [c.pid for c in by_job["b"].culprits] == [1101]


@pytest.mark.parametrize("missed_every", [0, 5])
def test_collectives_enqueued_back_to_back_count_the_late_rank_once(judged, missed_every):
    """A CPU backend enqueues without waiting: a rank that is late to a step is late to each of the
    step's collectives it enqueues, but the communicator runs them in order, so the others wait once.
    Also when rank 0 missed every fifth collective (a Flight Recorder read that came too late)."""
    judge, clock = judged
    trackers = [ArrivalTracker() for _ in range(2)]
    seq, t, steps = 0, 0.0, 0
    verdict = None
    for second in range(20):
        late = 0.03 if second >= 8 else 0.0
        starts: list[list[tuple[str, int, int, bool]]] = [[], []]
        ends = []
        while t < second + 1:
            for bucket in range(4):  # the step's 4 buckets, enqueued 1 ms apart on each rank
                seq += 1
                if not missed_every or seq % missed_every:
                    starts[0].append(("pg0", seq, int((t + bucket * 0.001) * 1e9), True))
                starts[1].append(("pg0", seq, int((t + late + bucket * 0.001) * 1e9), True))
            t += STEP_S + late
            steps += 1
            ends.append(int(t * 1e9))
        clock[0] += 1.0
        feeds = [RankFeed(pid=1000 + r, rank=r, host="node1", job_id="job", state=pb.RANK_STATE_RUNNING, step_count=steps,
                          arrivals=trackers[r].take(starts[r], 2), step_ends=ends)
                 for r in range(2)]
        (verdict,) = judge.observe(feeds)
    assert verdict is not None and verdict.slow and verdict.culprits[0].rank == 1
    # 30 ms at the first bucket, 1 ms at each of the next three, not 4 × 30 ms
    assert verdict.culprits[0].cost_seconds == pytest.approx(0.03, rel=0.1 if not missed_every else 0.25)


def test_ranks_with_the_same_pid_on_two_hosts_are_two_ranks(judged):
    judge, clock = judged
    job = Job()
    job.late[3] = 0.03
    verdicts = []
    for _ in range(12):
        clock[0] += 1.0
        feeds = job.second()
        verdicts = judge.observe([dataclasses.replace(f, pid=7, host=f"node{f.rank}") for f in feeds])
    (verdict,) = verdicts
    assert len(verdict.ranks) == 4 and verdict.slow
    assert [(c.host, c.pid, c.rank) for c in verdict.culprits] == [("node3", 7, 3)]


def test_the_readme_documents_every_cause_and_only_those():
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Why is my job slow?"):]
    table = section[section.index("| cause | evidence |"):section.index("\n\n", section.index("| cause | evidence |"))]
    documented = [line.split("`")[1] for line in table.splitlines()[2:]]
    causes = [word for word in words(pb.SlowdownCause.DESCRIPTOR).values() if word]  # UNSPECIFIED: healthy
    assert sorted(documented) == sorted(causes)
