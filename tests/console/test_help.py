"""`?` lists the keys of the screen it is opened over, made from the bindings (so it cannot drift)."""

from __future__ import annotations

import pytest
from textual.binding import Binding

from console.recordings import replay_app
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.screens.help import HelpScreen, render_keys

SCREENS = {  # keys from the cluster view to the screen
    "ClusterScreen": [], "HostScreen": ["enter"], "JobOpsScreen": ["n"], "TracesScreen": ["t"],
    "StacksScreen": ["s"],
}


@pytest.mark.parametrize("screen", list(SCREENS))
async def test_help_lists_every_binding_of_the_screen_and_of_the_app(screen: str) -> None:
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press(*SCREENS[screen])
        await pilot.pause(0.1)
        under = app.screen
        assert type(under).__name__ == screen
        await pilot.press("question_mark")
        await pilot.pause(0.05)
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.keys_text
        active = under.active_bindings
        for owner in (type(under), TuiprofApp):
            for binding in owner.BINDINGS:
                assert isinstance(binding, Binding)
                if active.get(binding.key) is None or active[binding.key].binding.action != binding.action:
                    continue  # shadowed by a key of the focused widget, or disabled here (pause outside replays)
                display = app.get_key_display(binding)
                assert any(display in line and (binding.tooltip or binding.description) in line
                           for line in text.splitlines() if line.startswith("  ")), \
                    f"{screen}: {display} ({binding.description}) missing from help"
        await pilot.press("escape")
        assert app.screen is under


def test_entries_fall_back_to_one_column_when_two_do_not_fit() -> None:
    groups = {"Wide": [("ctrl+shift+x", "a description long enough to need its own line"), ("y", "short")]}
    text = render_keys(groups, width=76)
    assert text.splitlines()[1:3] == ["  ctrl+shift+x  a description long enough to need its own line",
                                      "  y             short"]
    assert render_keys({"Narrow": [("a", "one"), ("b", "two")]}).splitlines()[1] == "  a  one   b  two"
