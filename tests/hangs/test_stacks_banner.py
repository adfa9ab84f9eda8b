from tuiprof.analysis.stacks_banner import hang_banner
from tuiprof.model.messages import HangLevel, HangStatus, RankVerdict
from tuiprof.model.values import Unavailable

S = 1_000_000_000


def hang(level, since=0, explanation="", verdicts=()):
    return HangStatus(level, since, explanation, tuple(RankVerdict(100 + i, r, lvl, "") for i, (r, lvl) in enumerate(verdicts)))


def test_no_banner_when_everything_is_ok():
    assert hang_banner([("a", hang("ok")), ("b", hang(""))], 10 * S) is None


def test_the_worst_level_wins_and_names_ranks_since_and_explanation():
    banner = hang_banner([
        ("a", hang("suspect", 50 * S, "rank 1: no optimizer step for 70 s", [(1, "suspect")])),
        ("b", hang("hung", 100 * S, "rank 6: all_reduce #1042 on comm 3fa1… launched 312 s ago, not finished",
                   [(6, "hung"), (7, "ok")])),
        ("c", hang("hung", 40 * S, "rank 9: stopped", [(9, "hung")])),
    ], 412 * S)
    assert banner.level == HangLevel.HUNG
    assert banner.text == (
        "HUNG on 2 hosts for 6 min 12 s — ranks 6,9 — b: rank 6: all_reduce #1042 on comm 3fa1… "
        "launched 312 s ago, not finished — press s for merged stacks")


def test_unknown_ranks_and_since_are_left_out():
    banner = hang_banner([("a", hang("suspect", 0, "pid 7: stopped", [(Unavailable("no RANK"), "suspect")]))], S)
    assert banner.text == "SUSPECT on 1 host — a: pid 7: stopped — press s for merged stacks"
