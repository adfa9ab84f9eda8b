"""NCCL/GEMM across the job: every rank's ops, straggler candidates first and highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from tuiprof.analysis.job_ops import OpRow, job_ops
from tuiprof.model import units
from tuiprof.tui.tables import sync_rows
from tuiprof.tui.text import reading
from tuiprof.tui.screens.base import ConsoleScreen

COLUMNS = ("Host", "Rank", "Kind", "Op", "Calls/s", "p50", "p99", "Throughput", "vs median")


def _cells(row: OpRow) -> list[Text | str]:
    throughput = reading(row.throughput, units.bytes_per_s if row.kind == "nccl" else units.tflops)
    if row.verdict is None:
        versus = Text("too few ranks", style="dim")
    else:
        versus = Text(f"{row.verdict.ratio:.2f}×")
        if row.verdict.straggler:
            versus = Text(f"{row.verdict.ratio:.2f}× STRAGGLER", style="bold red")
    cells: list[Text | str] = [
        row.host, row.rank, row.kind, row.op, units.per_s(row.count_per_s, ""),
        reading(row.p50_seconds, units.seconds), reading(row.p99_seconds, units.seconds),
        throughput, versus,
    ]
    if row.verdict is not None and row.verdict.straggler:
        cells[:4] = [Text(str(c), style="bold red") for c in cells[:4]]
    return cells


class JobOpsScreen(ConsoleScreen):
    """Per rank, per op latency across all hosts; Enter opens the row's host."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "open_host", "Host"),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="ops-summary", classes="summary", markup=False)
        table: DataTable[Text | str] = DataTable(id="ops", cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "NCCL/GEMM across the job"
        self.refresh_data()

    def on_screen_resume(self) -> None:
        self.refresh_data()

    def refresh_data(self) -> None:
        rows = job_ops(self.console.cluster)
        self._rows = rows
        table = self.query_one("#ops", DataTable)
        sync_rows(table, {f"{r.host}/{r.rank}/{r.kind}/{r.op}": _cells(r) for r in rows})
        stragglers = sum(1 for r in rows if r.verdict and r.verdict.straggler)
        if not rows:
            text = "no GEMM or NCCL ops reported yet (ranks appear once started with `tuiprof run -- CMD`)"
        else:
            text = (f"{len(rows)} rank×op rows · {stragglers} straggler candidate(s): "
                    "latency ≥ 1.5× the median of the same op across ranks and beyond 3 MADs")
        self.query_one("#ops-summary", Static).update(text)

    def action_open_host(self) -> None:
        table = self.query_one("#ops", DataTable)
        if self._rows and 0 <= table.cursor_row < len(self._rows):
            self.console.show_host(self._rows[table.cursor_row].host, tab="ranks")

    def on_data_table_row_selected(self, _: DataTable.RowSelected) -> None:
        self.action_open_host()

    def action_cursor(self, step: int) -> None:
        table = self.query_one("#ops", DataTable)
        table.action_cursor_down() if step > 0 else table.action_cursor_up()
