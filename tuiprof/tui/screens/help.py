"""The `?` screen: every key of the screen it was opened over, read from the bindings, what
that screen's colours and markers mean, and the filter language.

The key list is made from the live bindings (``Screen.active_bindings``: the
focused widget's, the screen's and the app's, hidden ones included), so it
cannot drift from what the keys do; the legend and the filter language are prose.
"""

from __future__ import annotations

import re
from itertools import zip_longest

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tuiprof.model.filter import help_text

LEGEND: dict[str, list[str]] = {
    "ClusterScreen": [
        "[b]gpu-node-04 ▼[/b]  the host most in need of attention: down, hung or suspect first, then the "
        "lowest GPU utilization, then the slowest step (w jumps there)",
        "[u]Host↑[/u]  the sorted column, ↑ ascending, ↓ descending (, . choose, I inverts, a click sorts)",
        "[green]up[/]  [dim]connecting[/]  [bold yellow]suspect[/]  [bold red]HUNG[/]  "
        "[bold red]DOWN 12s[/] (time since last contact)",
        "[dim]38%  41%[/]  a row dimmed: the host is down, these are its last known values",
        "Trend  mean GPU utilization, 0-100 %; [cyan]▂▅▇[/] in cyan: CPU busy, on hosts without GPU readings",
        "[bold on red] HUNG … [/] banner: ranks stopped in a collective; "
        "[bold on yellow] SUSPECT … [/]: progress stalled, not yet hung",
    ],
    "HostScreen": [
        "[green]running[/]  a rank in state running; [bold red]other states[/] in red",
        "[dim italic]none[/] / [dim italic]not a rank[/]  no job id / a GPU process that is no known rank",
        "Plots: time before now along the bottom, the unit in the title; z cycles the window "
        "(1 min, 5 min, 15 min, all the console holds), shown in the title",
        "Per-GPU and per-core plots: one line per GPU or core (the 8 busiest when more), named in the legend",
    ],
    "JobOpsScreen": [
        "[bold red]STRAGGLER[/]  a rank's op at ≥ 1.5× the median of the same op and beyond 3 MADs",
        "[dim]too few ranks[/]  fewer than three ranks run the op: no median to compare with",
    ],
    "StacksScreen": [
        "Frames reached by the same set of ranks share a colour; the smallest classes get "
        "[bold red]red[/], [bold magenta]magenta[/], [bold yellow]yellow[/] (the odd ranks stand out)",
        "[N-M] ranks that reached the frame, then their count; [i]not: [..][/i] those that did not",
    ],
}
"""What each screen's colours and markers mean (rich markup, drawn as the screen draws them)."""
NOTES = """\
[dim italic]n/a[/]  the agent could not take the reading; the line under each table says why.
Columns that do not fit the terminal's width are dropped, least important first; C chooses columns
(c: those of the table below, on the host view's GPUs and Ranks tabs).

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
        what = binding.tooltip or binding.description or binding.action  # the tooltip is the long form
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
            rows = [f"{left:<{cell_width}}   {right}".rstrip()
                    for left, right in zip_longest(cells[::2], cells[1::2], fillvalue="")]
        else:
            rows = cells
        lines += [escape(f"  {row}") for row in rows]
        lines.append("")
    return "\n".join(lines)


def render_legend(entries: list[str]) -> str:
    """The legend section (markup), or nothing for a screen without colours of its own."""
    if not entries:
        return ""
    return "[b]Colours and markers[/b]\n" + "".join(f"  {entry}\n" for entry in entries) + "\n"


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
        self.legend_text = render_legend(LEGEND.get(type(screen).__name__, []))

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(f"{self.keys_text}\n{self.legend_text}{NOTES}{help_text()}", id="help-text")
