"""Command palette entries: "Go to host …" and "Go to rank …" for everything being watched."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from tuiprof.tui.app import TuiprofApp


class GoToProvider(Provider):
    """Jump straight to a host, or to a rank's host on its Ranks tab."""

    @property
    def console(self) -> TuiprofApp:
        """``self.app`` with its real type (the palette is the console's)."""
        return cast("TuiprofApp", self.app)

    def _targets(self) -> Iterator[tuple[str, str, str | None]]:
        cluster = self.console.cluster
        for state in cluster.hosts():
            yield f"Go to host {state.name}", state.address, None
            if state.snapshot is not None:
                for rank in state.snapshot.ranks:
                    yield f"Go to {rank.label} on {state.name}", state.address, "ranks"

    def _open(self, address: str, tab: str | None) -> None:
        self.console.show_host(address, tab=tab)

    async def discover(self) -> Hits:
        for title, address, tab in self._targets():
            yield DiscoveryHit(title, partial(self._open, address, tab))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, address, tab in self._targets():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self._open, address, tab), text=title)
