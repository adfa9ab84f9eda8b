"""The base of the console's screens: typed access to the app's cluster state, source and connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.screen import Screen

if TYPE_CHECKING:
    from tuiprof.tui.app import TuiprofApp


class ConsoleScreen(Screen[None]):
    """A screen of ``TuiprofApp`` (``self.console`` is ``self.app`` with its real type)."""

    @property
    def console(self) -> TuiprofApp:
        return cast("TuiprofApp", self.app)
