"""Traces screen: capture a synchronized trace across the job, follow each host, read the summary.

Pushed with `t`. The form picks the kind (Kineto or the hook's timeline), the
span (milliseconds, training iterations, or the ring's last N events) and the
ranks (empty: the whole job, every watched host). `enter` on the form (or the
Capture button) starts it through the same code as ``tuiprof trace``: one
start time for every host, progress per host as it goes, then the summary the
agents made where the files are (reduced here: no trace bytes travel) with the
stragglers; the files stay on their nodes. `m` opens the merged timeline:
every file fetched into the output directory and merged (``--merge``).
The Count choice is ``--steps``: what the summary counts (all steps, or only
complete ones, dropping the last as HTA does); the agents count it so for the
next capture, and once the files are fetched, changing it summarises them
again here; the summary's "counted" line says what was counted.
"""

from __future__ import annotations

import asyncio
import pathlib
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Select, Static
from textual.worker import Worker, WorkerState

from agentd.address import AgentAddress
from agentd.stacks import ranksets
from tuiprof.analysis.stragglers import trace_stragglers
from tuiprof.analysis.trace_merge import merge_capture
from tuiprof.analysis.trace_reduce import reduce_summaries, remote_ranks
from tuiprof.analysis.trace_summary import STEP_MODES, TraceSummary, render_text
from tuiprof.client.capture import DEFAULT_START_DELAY_MS, CaptureSpec, capture_cluster, fetch_files
from tuiprof.errors import BadInputError
from tuiprof.model.capture import ClusterCapture, HostProgress
from tuiprof.model.messages import TraceTargetState
from tuiprof.tui.screens.base import ConsoleScreen

SPANS = (("milliseconds", "duration_ms"), ("iterations", "iterations"), ("last events (timeline)", "last_events"))
STEP_LABELS = {"all": "all steps", "complete": "complete steps (drop the last)"}


class CaptureFormError(BadInputError):
    """A form value that cannot be used; the message says which and why."""


def _positive(text: str, what: str) -> int:
    if not text.strip().isdigit() or int(text) <= 0:
        raise CaptureFormError(f"{what} must be a positive whole number, got {text!r}")
    return int(text)


def _ranks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise CaptureFormError(f"ranks must be comma-separated numbers (empty: the whole job), got {text!r}") from None


class TracesScreen(ConsoleScreen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("ctrl+r", "capture", "Capture"),
                Binding("m", "merge", "Merged timeline")]
    DEFAULT_CSS = """
    TracesScreen #traces-form { height: auto; padding: 0 1; background: $boost; }
    TracesScreen #traces-form Horizontal { height: auto; }
    TracesScreen #traces-form Label { padding: 1 1 0 0; }
    TracesScreen #traces-form Input { width: 1fr; }
    TracesScreen #traces-form Select { width: 1fr; }
    TracesScreen #traces-form #traces-amount, TracesScreen #traces-form #traces-delay { width: 12; }
    TracesScreen #traces-hosts { height: auto; max-height: 12; }
    TracesScreen #traces-summary { height: 1fr; padding: 0 1; overflow-y: auto; }
    """

    def __init__(self, output_root: pathlib.Path | None = None) -> None:
        super().__init__()
        self.output_root = output_root or pathlib.Path.cwd()
        self.capture: ClusterCapture | None = None
        self.summary: TraceSummary | None = None
        self.merged_path: pathlib.Path | None = None
        self.output: pathlib.Path | None = None  # where the capture's files go when fetched
        self.addresses: list[AgentAddress] = []
        self.problems: list[str] = []  # the capture's per-host problems, shown above the summary

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="traces-form"):
            with Horizontal():
                yield Label("Kind")
                yield Select((("Kineto profiler", "kineto"), ("hook timeline", "timeline")),
                             value="kineto", allow_blank=False, id="traces-kind")
                yield Label("Span")
                yield Select(SPANS, value="duration_ms", allow_blank=False, id="traces-span")
                yield Input("1000", id="traces-amount")
            with Horizontal():  # three rows, each fitting 80 columns
                yield Label("Count")
                yield Select(((STEP_LABELS[mode], mode) for mode in STEP_MODES), value="all", allow_blank=False,
                             id="traces-steps")
                yield Label("Ranks")
                yield Input("", placeholder="all", id="traces-ranks")
                yield Label("Start in ms")
                yield Input(str(DEFAULT_START_DELAY_MS), id="traces-delay")
            with Horizontal():
                yield Label("Output")
                yield Input(str(self.output_root / f"tuiprof-trace-{time.strftime('%Y%m%d-%H%M%S')}"),
                            id="traces-output")
                yield Button("Capture", id="traces-start", variant="primary")
        yield Static("Choose what to trace, then Capture (ctrl+r).", id="traces-status")
        yield DataTable(id="traces-hosts", cursor_type="row")
        yield Static("", id="traces-summary")
        yield Footer(compact=True, show_command_palette=False)  # 80 columns; ^p is in help

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("host", "phase", "ranks", "files", "detail")

    def spec(self) -> tuple[CaptureSpec, pathlib.Path]:
        """The capture the form describes (CaptureFormError when it does not hold together)."""
        kind = str(self.query_one("#traces-kind", Select).value)
        span = str(self.query_one("#traces-span", Select).value)
        amount = _positive(self.query_one("#traces-amount", Input).value, "the span")
        if kind == "kineto" and span == "last_events":
            raise CaptureFormError("last events is for timeline captures; Kineto takes milliseconds or iterations")
        if kind == "timeline" and span == "iterations":
            raise CaptureFormError("timeline captures take milliseconds or last events, not iterations")
        delay_text = self.query_one("#traces-delay", Input).value.strip()
        if not delay_text.isdigit():
            raise CaptureFormError(f"start in ms must be a whole number, got {delay_text!r}")
        output = pathlib.Path(self.query_one("#traces-output", Input).value.strip() or ".")
        spec = CaptureSpec(kind=kind, ranks=_ranks(self.query_one("#traces-ranks", Input).value), steps=self.steps,
                           start_delay_ms=int(delay_text) if kind == "kineto" else 0,
                           duration_ms=amount if span == "duration_ms" else None,
                           iterations=amount if span == "iterations" else None,
                           last_events=amount if span == "last_events" else None)
        return spec, output

    @on(Button.Pressed, "#traces-start")
    @on(Input.Submitted)
    def action_capture(self) -> None:
        if not self.console.source.live:
            self._status("Traces need live agents: this is a recording.")
            return
        try:
            spec, output = self.spec()
        except CaptureFormError as exc:
            self._status(f"Cannot capture: {exc}")
            return
        self.query_one("#traces-start", Button).disabled = True
        self.query_one("#traces-summary", Static).update("")
        self._status(f"Capturing on {len(self.console.cluster.addresses())} host(s)…")
        self._run(spec, output)

    @work(exclusive=True, group="traces", exit_on_error=False)
    async def _run(self, spec: CaptureSpec, output: pathlib.Path) -> None:
        addresses = [AgentAddress.parse(a) for a in self.console.cluster.addresses()]
        table = self.query_one(DataTable)
        table.clear()
        for address in addresses:
            table.add_row(str(address), "starting", "", "", "", key=str(address))
        started = time.monotonic()
        capture = await capture_cluster(addresses, spec, None, self.console.connection, self._progress)
        self.capture, self.addresses, self.output, self.merged_path = capture, addresses, output, None
        problems = [f"{h.host}: {h.error or h.message}" for h in capture.hosts if h.error or not h.targets]
        problems += [f"{h.host} {t.label}: {t.state}: {t.reason}"
                     for h in capture.hosts for t in h.targets if t.state != TraceTargetState.WRITTEN]
        if capture.matched == 0:
            problems.insert(0, "No processes matched on any host.")
        reduced = await asyncio.to_thread(reduce_summaries, remote_ranks(capture))
        problems += [f"no summary of {rank.where}: {why}" for rank, why in reduced.missing]
        self.problems = problems
        lines = list(problems)
        if reduced.summary.ranks:
            self.summary = reduced.summary
            lines += ["", render_text(reduced.summary)]
            lines += [f"straggler: rank {s.rank} on {s.host}: {s.why}" for s in trace_stragglers(reduced.summary)]
        self.query_one("#traces-summary", Static).update("\n".join(lines))
        written = sum(t.state == TraceTargetState.WRITTEN for h in capture.hosts for t in h.targets)
        verdict = "every rank wrote its file" if written == capture.matched > 0 and not any(
            h.error for h in capture.hosts) else "not every rank wrote its file"
        self._status(f"Done in {time.monotonic() - started:.1f} s: {verdict}; the files stay on their nodes "
                     "(m: fetch them and open the merged timeline)")
        self.query_one("#traces-start", Button).disabled = False

    def action_merge(self) -> None:
        """Fetch every file of the last capture and merge them (``tuiprof trace --merge``)."""
        if self.capture is None or self.output is None or not any(
                t.state == TraceTargetState.WRITTEN for h in self.capture.hosts for t in h.targets):
            self._status("No capture with files yet: Capture first (ctrl+r).")
            return
        self._status(f"Fetching every file into {self.output} and merging…")
        self._open_merged(self.capture, self.output)

    @work(exclusive=True, group="traces", exit_on_error=False)
    async def _open_merged(self, capture: ClusterCapture, output: pathlib.Path) -> None:
        output.mkdir(parents=True, exist_ok=True)
        errors = await fetch_files(self.addresses, capture, lambda host, target: True, output,
                                   self.console.connection)
        for host in capture.hosts:
            self._progress(host)
        self.problems += [f"cannot fetch {error}" for error in errors]
        lines = self.problems + (await self._merge(capture, output) if capture.files else [])
        self.query_one("#traces-summary", Static).update("\n".join(lines))
        self._status(f"Merged timeline: {self.merged_path}" if self.merged_path else "No file could be fetched")

    @property
    def steps(self) -> str:
        return str(self.query_one("#traces-steps", Select).value)

    async def _merge(self, capture: ClusterCapture, output: pathlib.Path) -> list[str]:
        """Merge and summarise the fetched files with the chosen step window (as ``tuiprof trace --merge --steps``)."""
        merged, summary = await asyncio.to_thread(merge_capture, capture, output, self.steps)
        self.summary, self.merged_path = summary, merged.output
        return [f"Merged trace: {merged.output} ({merged.events} events; open in ui.perfetto.dev)", "",
                render_text(summary)]

    @on(Select.Changed, "#traces-steps")
    def _steps_changed(self) -> None:
        if self.capture is not None and self.capture.files and self.merged_path is not None:
            self._status(f"Summarising again: {STEP_LABELS[self.steps]}…")
            self._resummarise(self.capture, self.merged_path.parent)
        elif self.capture is not None:
            self._status(f"The next capture counts {STEP_LABELS[self.steps]} (the agents summarise); m fetches "
                         "this one's files to count them here")

    @work(exclusive=True, group="traces", exit_on_error=False)
    async def _resummarise(self, capture: ClusterCapture, output: pathlib.Path) -> None:
        lines = self.problems + await self._merge(capture, output)
        self.query_one("#traces-summary", Static).update("\n".join(lines))
        self._status(f"Summary counts {STEP_LABELS[self.steps]}; files in {output}")

    def _progress(self, host: HostProgress) -> None:
        table = self.query_one(DataTable)
        detail = host.error or host.message or host.states_text()
        for column, value in zip(table.columns, (host.host, host.phase, _targets_text(host), _files_text(host),
                                                 detail), strict=True):
            table.update_cell(host.host, column, value, update_width=True)  # a detail is never cut to "1 writ"

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "traces" and event.state == WorkerState.ERROR:
            error = event.worker.error
            self._status(f"Capture failed: {type(error).__name__}: {error}")
            self.query_one("#traces-start", Button).disabled = False

    def _status(self, text: str) -> None:
        self.query_one("#traces-status", Static).update(text)


def _targets_text(host: HostProgress) -> str:
    """The host's targets: their rank numbers ("rank 0", "ranks 0-3"), else how many processes."""
    numbers = [t.rank_number for t in host.targets if t.rank_number is not None]
    if numbers:
        return f"rank{'s' if len(numbers) > 1 else ''} {ranksets.fold(numbers)}"
    return f"{len(host.targets)} process{'es' if len(host.targets) != 1 else ''}"


def _files_text(host: HostProgress) -> str:
    """Files written where the targets run, and those fetched here."""
    written = sum(t.state == TraceTargetState.WRITTEN for t in host.targets)
    return f"{written} on node" + (f", {len(host.files)} here" if host.files else "")
