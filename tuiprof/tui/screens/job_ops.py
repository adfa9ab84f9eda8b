"""NCCL/GEMM across the job: every rank's ops, straggler candidates first and highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import slowdown_cause
from tuiprof.analysis.job_ops import Extreme, OpRow, job_ops
from tuiprof.analysis.slowdown import slow_banner
from tuiprof.model import units
from tuiprof.tui.tables import FittedTable, TableColumn
from tuiprof.model.values import Unavailable
from tuiprof.tui.text import reading, reasons, set_content
from tuiprof.tui.screens.base import ConsoleScreen

COLUMNS = (
    TableColumn("Host", 100), TableColumn("Rank", 95), TableColumn("Kind", 60), TableColumn("Op", 90),
    TableColumn("Job", 80), TableColumn("Calls/s", 40), TableColumn("p50", 70), TableColumn("p99", 75),
    TableColumn("Min", 30), TableColumn("Max", 35), TableColumn("First call", 25), TableColumn("Timed", 20),
    TableColumn("Throughput", 65),
    TableColumn("vs median", 85),
)
"""Each column's priority: at a narrow width the lowest go first."""

LEGEND = ("≥ min, ≤ max: a histogram bucket's edge, no call's own time; "
          "first call: a GEMM's first, which includes loading, kept out of the other figures; "
          "timed: which GEMM calls the latency and TFLOP/s come from (counts are exact)")


def _extreme(extreme: Extreme, bound: str) -> Text:
    """A min or max; ``bound`` (``≥``/``≤``) in front when it is a bucket edge, not a call's time."""
    cell = reading(extreme.seconds, units.seconds)
    if extreme.exact or isinstance(extreme.seconds, Unavailable):
        return cell
    return Text(bound) + cell


def _cells(row: OpRow) -> list[Text | str]:
    throughput = reading(row.throughput, units.bytes_per_s if row.kind == "nccl" else units.tflops)
    if row.verdict is None:
        versus = Text("too few ranks", style="dim")
    else:
        versus = Text(f"{row.verdict.ratio:.2f}×")
        if row.verdict.straggler:
            versus = Text(f"{row.verdict.ratio:.2f}× STRAGGLER", style="bold red")
    first_call = "" if row.first_call_seconds is None else reading(row.first_call_seconds, units.seconds)
    cells: list[Text | str] = [
        row.host, row.rank, row.kind, row.op, row.job or Text("none", style="dim italic"),
        units.per_s(row.count_per_s, ""),
        reading(row.p50_seconds, units.seconds), reading(row.p99_seconds, units.seconds),
        _extreme(row.min_seconds, "≥"), _extreme(row.max_seconds, "≤"), first_call,
        "" if row.timing is None else row.timing.rate,
        throughput, versus,
    ]
    if row.verdict is not None and row.verdict.straggler:
        cells[:4] = [Text(str(c), style="bold red") for c in cells[:4]]
    return cells


def _detail(row: OpRow, slow: dict[tuple[str, int], pb.JobSlowdown]) -> str:
    """Which process the highlighted row is, and why its n/a cells are n/a; the evidence when the
    others wait for it."""
    named = {"p50": row.p50_seconds, "p99": row.p99_seconds, "min": row.min_seconds.seconds,
             "max": row.max_seconds.seconds, "throughput": row.throughput}
    if row.first_call_seconds is not None:
        named["first call"] = row.first_call_seconds
    timing = [row.timing.describe()] if row.timing is not None else []
    verdict = slow.get((row.job, row.pid))
    evidence = [f"SLOW ({slowdown_cause(verdict.cause).replace('_', ' ')}): " + "; ".join(verdict.evidence)] if verdict else []
    return " · ".join([f"{row.host} {row.rank} pid {row.pid} job {row.job or 'none'}", *evidence, *timing,
                       *reasons(named)])


def _by_cost(rows: list[OpRow], verdicts: list[pb.JobSlowdown]) -> list[OpRow]:
    """The rows of slow jobs' ranks first, costliest rank first; the rest as they were."""
    cost = {(v.job_id, c.pid): c.cost_seconds for v in verdicts if v.slow for c in v.ranks}
    if not cost:
        return rows
    return sorted(rows, key=lambda row: -cost.get((row.job, row.pid), -1.0))


class JobOpsScreen(ConsoleScreen):
    """Per rank, per op latency across all hosts; Enter opens the row's host."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "open_host", "Host"),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
        Binding("C", "columns", "Columns", show=False),
    ]

    _drawn_version = -1
    """The cluster state's version the rows were made from."""
    _slow: dict[tuple[str, int], pb.JobSlowdown] = {}
    """The slow jobs' verdicts by (job, pid) of the ranks the others wait for."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="ops-summary", classes="summary", markup=False)
        yield Static(id="slow-banner", markup=False)
        yield FittedTable(COLUMNS, id="ops")
        yield Static(id="ops-detail", classes="detail", markup=False)
        yield Footer(compact=True, show_command_palette=False)  # 80 columns; ^p is in help

    def on_mount(self) -> None:
        self.sub_title = "NCCL/GEMM across the job"
        self.query_one("#ops", FittedTable).set_hidden(self.console.hidden_columns("ops"))
        self.refresh_data()

    def on_screen_resume(self) -> None:
        self.refresh_data()

    def refresh_data(self) -> None:
        """Redraw from the cluster's state when it changed (the once-a-second redraw without news
        would make every host's rows again, to the same cells: nothing here depends on the clock)."""
        if self.console.cluster.version == self._drawn_version:
            return
        self._drawn_version = self.console.cluster.version
        verdicts = self.console.slowdowns.verdicts
        rows = _by_cost(job_ops(self.console.cluster), verdicts)
        self._rows = rows
        self._slow = {(v.job_id, c.pid): v for v in verdicts if v.slow for c in v.culprits}
        banner = slow_banner(verdicts)
        widget = self.query_one("#slow-banner", Static)
        widget.display = banner is not None
        if banner is not None:
            set_content(widget, banner.text)
        table = self.query_one("#ops", FittedTable)
        table.show_rows({r.key: _cells(r) for r in rows})
        stragglers = sum(1 for r in rows if r.verdict and r.verdict.straggler)
        if not rows:
            text = "no GEMM or NCCL ops reported yet (ranks appear once started with `tuiprof run -- CMD`)"
        else:
            text = (f"{len(rows)} rank×op rows · {stragglers} straggler candidate(s): "
                    "latency ≥ 1.5× the median of the same op across the job's ranks and beyond 3 MADs\n"
                    + LEGEND)
        set_content(self.query_one("#ops-summary", Static), text)
        self.update_detail()

    def update_detail(self) -> None:
        row = self._highlighted()
        set_content(self.query_one("#ops-detail", Static), _detail(row, self._slow) if row is not None else "")

    def _highlighted(self) -> OpRow | None:
        table = self.query_one("#ops", DataTable)
        return self._rows[table.cursor_row] if self._rows and 0 <= table.cursor_row < len(self._rows) else None

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self.update_detail()

    def action_open_host(self) -> None:
        row = self._highlighted()
        if row is not None:
            self.console.show_host(row.host, tab="ranks")

    def on_data_table_row_selected(self, _: DataTable.RowSelected) -> None:
        self.action_open_host()

    def action_columns(self) -> None:
        table = self.query_one("#ops", FittedTable)
        self.console.choose_columns("ops", "the op table", [c.label for c in COLUMNS], table.set_hidden)

    def action_cursor(self, step: int) -> None:
        table = self.query_one("#ops", DataTable)
        table.action_cursor_down() if step > 0 else table.action_cursor_up()
