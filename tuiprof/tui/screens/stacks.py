"""Stacks screen: every rank's stacks merged into one tree, the odd ranks named.

Pushed with `s`. Takes stacks from every watched agent (in Prometheus mode: the
agents of the hosts with ranks there, at most ``RANK_HOSTS_AT_ONCE``) on open and
on `r` (through the same code as ``tuiprof stacks``), merges the hosts' trees, and
shows the tree with each frame's rank set and the ranks that did *not* reach it;
frames reached by the same rank set share a colour. `j` jumps to the smallest
class, `n`/`l` toggle native frames and line numbers, `f`/`g` export folded
stacks and a flame-graph SVG into the current directory.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.worker import Worker, WorkerState
from textual.binding import Binding
from textual.widgets import Footer, Header, Static, Tree
from textual.widgets.tree import TreeNode

from agentd.address import AgentAddress
from agentd.stacks import ranksets
from agentd.stacks.merge import Node
from agentd.stacks.verdicts import summarize, who
from tuiprof.analysis.flamegraph import flamegraph_svg
from tuiprof.analysis.stacks_report import StacksReport, cached_note, folded, frame_of, job_report, job_verdicts
from tuiprof.client.prometheus import NO_RANKS, NO_VIEW_YET, PrometheusSource
from tuiprof.client.stacks import gather_stacks
from tuiprof.model.stacks import HostStacks, JobChoiceError
from tuiprof.tui.screens.base import ConsoleScreen

TAKE_TIMEOUT_S = 60.0
MAX_RANK_ERRORS = 4
"""Lines of per-rank errors in the status bar (the rest are counted)."""
# Class colours, smallest class first: the odd ranks get the loudest ones.
CLASS_STYLES = ("bold red", "bold magenta", "bold yellow", "bold cyan", "bold green", "bold blue")


def _rank_errors(hosts: list[HostStacks]) -> list[str]:
    """``host rank N: why`` for every rank whose stacks came back incomplete or not at all."""
    return [f"{h.host} {who(r)}: {r.error}" for h in hosts if h.reply is not None for r in h.reply.ranks if r.error]


def _cached_notes(hosts: list[HostStacks]) -> list[str]:
    """``host ranks [0-3]: stacks of their last dump, …`` for every host that served a rank's last dump again."""
    return [f"{h.host} {cached_note(cached)}" for h in hosts if h.reply is not None
            if (cached := [r for r in h.reply.ranks if r.cached])]


class StacksScreen(ConsoleScreen):
    """Every rank's stacks merged into one tree, coloured by class, so the odd rank stands out."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "take", "Retake", tooltip="Take stacks now"),
        Binding("j", "smallest", "Smallest", tooltip="Jump to the smallest class"),
        Binding("n", "toggle_native", "Native", tooltip="Native frames on/off", show=False),
        Binding("l", "toggle_lines", "Lines", tooltip="Line numbers on/off", show=False),
        Binding("e", "expand_all", "Expand all", show=False),
        Binding("c", "collapse_all", "Collapse all", show=False),
        Binding("f", "export_folded", "Folded", tooltip="Export folded stacks", show=False),
        Binding("g", "export_svg", "SVG", tooltip="Export a flame-graph SVG", show=False),
        Binding("J", "next_job", "Next job", show=False),
    ]
    DEFAULT_CSS = """
    StacksScreen #stacks-status { height: auto; padding: 0 1; background: $boost; }
    StacksScreen #stacks-tree { height: 1fr; }
    StacksScreen #stacks-classes { height: auto; max-height: 12; padding: 0 1; background: $panel; }
    """

    def __init__(self, export_dir: pathlib.Path | None = None) -> None:
        super().__init__()
        self.native = False
        self.lines = False
        self.export_dir = export_dir or pathlib.Path.cwd()
        self.hosts: list[HostStacks] = []
        self.report: StacksReport | None = None
        self._taken_native = False
        self._smallest: TreeNode | None = None
        self.jobs: list[str] = []  # filled when the hosts run several jobs
        self.job: str | None = None
        self._asked = ""
        """Which agents were asked, in Prometheus mode ("" over every host of the view)."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="stacks-status")
        yield Tree("stacks", id="stacks-tree")
        yield Static("", id="stacks-classes")
        yield Footer(compact=True, show_command_palette=False)  # 80 columns; ^p is in help

    def on_mount(self) -> None:
        self.query_one(Tree).show_root = False
        self.action_take()

    # ------------------------------------------------------------ taking

    def action_take(self) -> None:
        if not self.console.source.live:
            self._status("Stacks need live agents: this is a recording.")
            return
        addresses, self._asked = self._hosts_to_ask()
        if addresses is None:
            self._status(f"No stacks taken: {self._asked}.")
            return
        asked = self._asked or f"{len(addresses)} host(s)"
        self._status(f"Taking stacks on {asked}{' with native frames' if self.native else ''}…")
        self._take(self.native, [AgentAddress.parse(a) for a in addresses])

    def _hosts_to_ask(self) -> tuple[list[str] | None, str]:
        """The agents to ask: every host of the view, or in Prometheus mode (a fleet of thousands)
        only those with ranks there, as the NCCL/GEMM view (``PrometheusSource.rank_hosts``),
        with a note saying so (None: no agent to ask, the note says why)."""
        source = self.console.source
        if not isinstance(source, PrometheusSource):
            return self.console.cluster.addresses(), ""
        chosen = source.rank_hosts()
        if chosen is None or not chosen.addresses:
            return None, NO_VIEW_YET if chosen is None else NO_RANKS
        note = f"the {len(chosen.addresses)} host(s) with ranks in Prometheus"
        return chosen.addresses, f"{note}: {chosen.cut()}" if chosen.cut() else note

    @work(exclusive=True, group="stacks", exit_on_error=False)
    async def _take(self, native: bool, addresses: list[AgentAddress]) -> None:
        started = time.monotonic()
        try:
            hosts = await gather_stacks(addresses, self.console.connection, True, native, TAKE_TIMEOUT_S, self.job)
        except JobChoiceError as exc:  # several jobs: show the first, J cycles
            self.jobs, self.job = sorted(exc.jobs), sorted(exc.jobs)[0]
            hosts = await gather_stacks(addresses, self.console.connection, True, native, TAKE_TIMEOUT_S, self.job)
        # An agent may serve a rank's recent Python-only dump again (py-spy stops the process),
        # with stacks and an error saying so: then native frames are not in hand.
        served_again = any(r.error and r.threads for h in hosts if h.reply is not None for r in h.reply.ranks)
        self.hosts, self._taken_native = hosts, native and not served_again
        self._show(f"taken in {time.monotonic() - started:.1f} s{' from ' + self._asked if self._asked else ''}")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "stacks" and event.state == WorkerState.ERROR:
            error = event.worker.error
            self._status(f"Taking stacks failed: {type(error).__name__}: {error}")

    # ------------------------------------------------------------ showing

    def _show(self, note: str = "") -> None:
        report = self.report = job_report(self.hosts, lines=self.lines, native=self.native and self._taken_native)
        failed = [f"{h.host}: {h.error}" for h in self.hosts if h.error]
        hang = [f"{h.host}: {text}" for h in self.hosts if (text := summarize(job_verdicts(h)))]
        job = f"job {self.job or '(no id)'} ({self._job_position() + 1} of {len(self.jobs)}, J: next) · " \
            if self.jobs else ""
        head = (f"{job}{report.merged.ranks.bit_count()} ranks on {len(self.hosts) - len(failed)} host(s)"
                f" · native {'on' if self.native else 'off'} · lines {'on' if self.lines else 'off'}"
                f"{' · ' + note if note else ''}")
        errors = _rank_errors(self.hosts)
        shown = errors[:MAX_RANK_ERRORS] + ([f"… and {len(errors) - MAX_RANK_ERRORS} more"]
                                            if len(errors) > MAX_RANK_ERRORS else [])
        self._status("\n".join([head, *hang, *(f"no stacks from {f}" for f in failed), *shown,
                                *_cached_notes(self.hosts)]))
        styles = {c.ranks: CLASS_STYLES[i % len(CLASS_STYLES)]
                  for i, c in enumerate(report.classes) if i < len(report.classes) - 1}
        self._fill_tree(report, styles)
        self.query_one("#stacks-classes", Static).update(self._classes_text(report, styles))

    def _fill_tree(self, report: StacksReport, styles: dict[int, str]) -> None:
        tree: Tree = self.query_one(Tree)
        tree.clear()
        self._smallest = None
        smallest = report.classes[0] if len(report.classes) > 1 else None
        merged = report.merged
        for thread, root in sorted(merged.threads.items(), key=lambda kv: kv[0] != report.thread):
            group = tree.root.add(Text(f"{thread}  [{ranksets.fold_short(root.ranks, unranked=merged.unranked)}]",
                                       style="bold"),
                                  expand=thread == report.thread)
            pending: list[tuple[Node, TreeNode, tuple]] = [(root, group, ())]
            while pending:
                node, parent, path = pending.pop()
                for child in node.sorted_children():
                    child_path = path + (child.frame,)
                    label = self._label(child, merged.missing(child), styles, merged.unranked)
                    item = parent.add(label, expand=thread == report.thread) if child.children \
                        else parent.add_leaf(label)
                    if smallest is not None and thread == report.thread and child_path == smallest.frames:
                        self._smallest = item
                    pending.append((child, item, child_path))

    @staticmethod
    def _label(node: Node, missing: int, styles: dict[int, str], unranked: dict[int, str]) -> Text:
        text = Text(frame_of(node).label(), style=styles.get(node.ranks, ""))
        text.append(f"  [{ranksets.fold_short(node.ranks, unranked=unranked)}] {node.ranks.bit_count()}",
                    style="dim" if node.ranks not in styles else "")
        if missing:
            text.append(f"  not: [{ranksets.fold_short(missing, unranked=unranked)}]", style="italic")
        return text

    @staticmethod
    def _classes_text(report: StacksReport, styles: dict[int, str]) -> Text:
        if report.thread is None:
            return Text("No ranks on these hosts: no stacks to merge (start the job with `tuiprof run`).")
        text = Text(f"Classes of {report.thread} (smallest first):\n")
        for c in report.classes:
            text.append(f"{c.count:>5}  [{ranksets.fold_short(c.ranks, unranked=report.merged.unranked)}]  "
                        f"{c.where()}\n", style=styles.get(c.ranks, ""))
        if report.suspects:
            for suspect in report.suspects:
                text.append(f"Suspect: {suspect.reason}\n", style="bold")
        else:
            text.append("No suspect: no rank stands apart.")
        return text

    def _status(self, text: str) -> None:
        self.query_one("#stacks-status", Static).update(text)

    # ------------------------------------------------------------ keys

    def action_smallest(self) -> None:
        if self._smallest is None:
            self.notify("No smaller class to jump to: every rank is in the same place.")
            return
        node = self._smallest
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        tree = self.query_one(Tree)
        tree.move_cursor(node)
        tree.scroll_to_node(node)
        tree.focus()

    def action_next_job(self) -> None:
        if len(self.jobs) < 2:
            self.notify("Only one job runs on these hosts.")
            return
        self.job = self.jobs[(self._job_position() + 1) % len(self.jobs)]
        self.action_take()

    def _job_position(self) -> int:
        """Where the job shown is among ``jobs`` (the hosts run several)."""
        return self.jobs.index(self.job) if self.job is not None else 0

    def action_toggle_native(self) -> None:
        self.native = not self.native
        if self.native and not self._taken_native:
            self.action_take()  # the stacks in hand have no native frames
        elif self.hosts:
            self._show()

    def action_toggle_lines(self) -> None:
        self.lines = not self.lines
        if self.hosts:
            self._show()

    def action_expand_all(self) -> None:
        self.query_one(Tree).root.expand_all()

    def action_collapse_all(self) -> None:
        for group in self.query_one(Tree).root.children:
            group.collapse_all()

    def action_export_folded(self) -> None:
        self._export("folded", lambda report: folded(report.merged))

    def action_export_svg(self) -> None:
        self._export("svg", lambda report: flamegraph_svg(report.merged, title="tuiprof stacks"))

    def _export(self, suffix: str, render: Callable[[StacksReport], str]) -> None:
        if self.report is None:
            self.notify("No stacks yet: press r to take them.", severity="warning")
            return
        if not self.report.merged.ranks:
            self.notify("No stacks to export: these hosts have no ranks.", severity="warning")
            return
        path = self.export_dir / f"tuiprof-stacks-{time.strftime('%Y%m%d-%H%M%S')}.{suffix}"
        try:
            path.write_text(render(self.report))
        except OSError as exc:
            self.notify(f"cannot write {path}: {exc.strerror}", severity="error")
            return
        self.notify(f"wrote {path}")
