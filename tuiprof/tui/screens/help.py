"""The `?` screen: every key, and the filter language."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tuiprof.model.filter import help_text

KEYS = """\
[b]Everywhere[/b]
  q            quit                     ?        this help
  Esc          back                     ctrl+p   command palette (go to host/rank, theme)
  n            NCCL/GEMM across the job t        traces      s   stacks
  T            light/dark theme         j/k      down/up (vim keys)
  space        pause/resume a replay (`tuiprof replay FILE`)

[b]Cluster view[/b]
  Enter        open the host            /        filter (Esc clears)
  , / .        sort by previous/next column      I   invert the sort
  w            jump to the worst host (down, hung, idlest GPU, slowest step)
  g / G        first / last row         PgUp/PgDn, Home/End  page, edges
  ← / →        scroll sideways (the host column stays)   click a header to sort by it

[b]Host view[/b]
  1-6          GPUs, CPU, Net/Disk, Ranks, PMU, History     h/l  previous/next tab
  j/k on Ranks pick a rank; its GEMM/NCCL ops show below

[b]NCCL/GEMM view[/b]
  every rank × op across the job, straggler candidates first (≥1.5× the op's median
  latency across ranks and beyond 3 MADs); Enter opens the row's host

n/a means the agent could not take the reading; the line under each table says why.

[b]Filter[/b]  words match host names; comparisons (all must hold), e.g. util<10 mem>90
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(KEYS + help_text(), id="help-text")
