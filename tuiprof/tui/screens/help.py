"""The `?` screen: every key of the screen it was opened over, read from the bindings, and the filter language.

The key list is made from the live bindings (``Screen.active_bindings``: the
focused widget's, the screen's and the app's, hidden ones included), so it
cannot drift from what the keys do; only the filter language is prose.
"""

from __future__ import annotations

import re

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tuiprof.model.filter import help_text

NOTES = """\
n/a means the agent could not take the reading; the line under each table says why.

[b]Filter[/b] (cluster view, /)  words match host names; comparisons (all must hold), e.g. util<10 mem>90
"""
WIDTH = 76
"""Characters a line of keys may take: two columns where they fit in an 80-column terminal."""


def _words(node: object) -> str:
    """``Job Ops`` for ``JobOpsScreen``, ``Data Table`` for ``DataTable``."""
    return " ".join(re.findall(r"[A-Z][a-z]*", type(node).__name__.removesuffix("Screen")))


def key_groups(screen: Screen) -> dict[str, list[tuple[str, str]]]:
    """``{section: [(keys, what they do), …]}`` from the screen's active bindings.

    Sections: the screen's own keys, then those of the widget that has the
    focus, then the app's ("Everywhere"). Within a section, keys bound to the
    same action with the same description are listed together (``^q/q  Quit``).
    """
    app = screen.app
    sections: dict[str, dict[tuple[str, str], list[str]]] = {}
    own = {(b.action, b.description) for b in type(screen).BINDINGS if isinstance(b, Binding)}

    def order(active: ActiveBinding) -> tuple[int, bool]:  # the screen's own keys before Textual's
        return _rank(active.node, screen), (active.binding.action, active.binding.description) not in own

    for active in sorted(screen.active_bindings.values(), key=order):
        binding: Binding = active.binding
        section = _section(active.node, screen)
        what = binding.description or binding.action
        keys = sections.setdefault(section, {}).setdefault((what, binding.action), [])
        display = app.get_key_display(binding)
        if display not in keys:
            keys.append(display)
    return {section: [("/".join(keys), what) for (what, _), keys in entries.items()]
            for section, entries in sections.items()}


def _rank(node: object, screen: Screen) -> int:
    return 0 if node is screen else 2 if node is screen.app else 1


def _section(node: object, screen: Screen) -> str:
    if node is screen:
        return f"{_words(screen)} screen"
    if node is screen.app:
        return "Everywhere"
    return f"{_words(screen)} screen, in the {_words(node).lower()}"


def render_keys(groups: dict[str, list[tuple[str, str]]], width: int = WIDTH) -> str:
    """Each section as two entries per line where they fit in ``width``, else one.

    Markup-escaped: keys like ``[`` are shown, not parsed.
    """
    lines = []
    for section, entries in groups.items():
        lines.append(f"[b]{escape(section)}[/b]")
        key_width = max(len(keys) for keys, _ in entries)
        cells = [f"{keys:<{key_width}}  {what}" for keys, what in entries]
        cell_width = max(len(cell) for cell in cells)
        if 2 + 2 * cell_width + 3 <= width:
            rows = [f"{left:<{cell_width}}   {right}".rstrip() for left, right in zip(cells[::2], cells[1::2] + [""])]
        else:
            rows = cells
        lines += [escape(f"  {row}") for row in rows]
        lines.append("")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    """Every key of ``screen`` (the one `?` was pressed on), then the filter language."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def __init__(self, screen: Screen) -> None:
        super().__init__()
        self.keys_text = render_keys(key_groups(screen))

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(f"{self.keys_text}\n{NOTES}{help_text()}", id="help-text")
