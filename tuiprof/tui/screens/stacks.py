"""Stacks screen: hang status and merged stacks across ranks (owned by the hangs area).

The app pushes this screen with the `s` key. It reads the cluster from
``self.app.cluster`` (a ``tuiprof.model.cluster.ClusterState``) and the connection
settings from ``self.app.connection`` (a ``tuiprof.client.host_client.ConnectionOptions``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Static


class StacksScreen(Screen[None]):
    """Placeholder until hang detection lands: says so instead of showing empty data."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Stacks: not available yet (hang detection is a later issue).", id="stacks-body")
        yield Footer()
