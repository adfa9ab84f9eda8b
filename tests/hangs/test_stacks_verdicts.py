from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks.verdicts import summarize


def verdict(rank, level, text, pid=None):
    v = pb.RankVerdict(pid=pid or 100 + rank, level=level, explanation=f"rank {rank}: {text}")
    v.rank = rank
    return v


def test_identical_findings_fold_over_their_ranks_worst_level_first():
    stall = "no optimizer step for 7 s (step 20, median step 0.07 s)"
    verdicts = [verdict(r, pb.HANG_LEVEL_HUNG, stall) for r in (0, 1, 3)]
    verdicts.append(verdict(2, pb.HANG_LEVEL_SUSPECT, "stopped (SIGSTOP or a debugger) for 3 s"))
    verdicts.append(verdict(4, pb.HANG_LEVEL_OK, "running, at step 7"))
    unranked = pb.RankVerdict(pid=77, level=pb.HANG_LEVEL_HUNG, explanation=f"pid 77: {stall}")
    assert summarize([*verdicts, unranked]) == (
        f"hung: ranks 0-1,3 and pid 77: {stall}; suspect: rank 2: stopped (SIGSTOP or a debugger) for 3 s")


def test_nothing_to_say():
    assert summarize([verdict(0, pb.HANG_LEVEL_OK, "running, at step 7")]) == ""
