"""The one definition of who held a collective up and for how long (agentd.slowdown.waits)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentd.slowdown.waits import arrivals


def test_the_last_start_is_charged_the_gap_to_the_runner_up():
    figures = arrivals([10.0, 40.0, 25.0, 12.0])
    assert (figures.earliest, figures.latest, figures.last, figures.calls) == (10.0, 40.0, 1, 4)
    assert figures.held_us == 15.0  # had it started with the runner-up (25), the collective could begin then


def test_a_tie_for_last_holds_no_one_up_and_names_the_later_call():
    figures = arrivals([5.0, 30.0, 30.0])
    assert figures.last == 2 and figures.held_us == 0.0
    assert arrivals([7.0]).held_us == 0.0


@given(st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=64))
def test_figures_agree_with_sorting(starts):
    figures = arrivals(starts)
    ordered = sorted(starts)
    assert figures.latest == ordered[-1] and figures.earliest == ordered[0]
    assert figures.held_us == (ordered[-1] - ordered[-2] if len(ordered) > 1 else 0.0)
    assert starts[figures.last] == ordered[-1]
    assert all(start < ordered[-1] for start in starts[figures.last + 1:])
