"""A job stopped with SIGTERM (scheduler, launcher, Ctrl-C of torchrun) is a clean stop, not a suspect."""

from agentd.hang.detector import HangDetector, Thresholds
from agentd.proto import tuiprof_agent_pb2 as pb

SIGTERM, SIGKILL = 15, 9


def _observe(*ranks: pb.RankStats) -> pb.HangStatus:
    return HangDetector(Thresholds(10, 30)).observe(ranks)


def _rank(number: int, state: pb.RankState = pb.RANK_STATE_EXITED, **kw) -> pb.RankStats:
    return pb.RankStats(pid=200 + number, rank=number, job_id="j1", state=state, **kw)


def test_a_whole_job_stopped_by_sigterm_is_ok():
    status = _observe(_rank(0, exit_signal=SIGTERM), _rank(1, exit_signal=SIGTERM))
    assert status.level == pb.HANG_LEVEL_OK and status.explanation == ""
    assert status.ranks[0].explanation == "rank 0: stopped by signal 15 (SIGTERM)"


def test_sigterm_to_one_rank_while_its_job_runs_on_is_suspect():
    status = _observe(_rank(0, exit_signal=SIGTERM), _rank(1, state=pb.RANK_STATE_RUNNING))
    assert status.level == pb.HANG_LEVEL_SUSPECT and "rank 0: stopped by signal 15 (SIGTERM)" in status.explanation


def test_sigkill_of_a_whole_job_is_still_reported():
    status = _observe(_rank(0, exit_signal=SIGKILL), _rank(1, exit_signal=SIGKILL))
    assert status.level == pb.HANG_LEVEL_SUSPECT and "killed by signal 9 (SIGKILL)" in status.explanation
