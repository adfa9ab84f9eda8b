"""Traces screen: on-demand trace captures across the job (owned by the traces area).

The app pushes this screen with the `t` key. It reads the cluster from
``self.app.cluster`` (a ``tuiprof.model.cluster.ClusterState``) and the connection
settings from ``self.app.connection`` (a ``tuiprof.client.host_client.ConnectionOptions``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Static


class TracesScreen(Screen[None]):
    """Placeholder until trace capture lands: says so instead of showing empty data."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Traces: not available yet (trace capture is a later issue).", id="traces-body")
        yield Footer()
