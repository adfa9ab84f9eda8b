"""Cluster view: one row per host, sortable, filterable, the worst host one key away."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Header, Input, Static

from tuiprof.analysis.slowdown import fleet_slow_banner, slow_banner
from tuiprof.analysis.stacks_banner import hang_banner
from tuiprof.model import units
from tuiprof.model.cluster import ClusterState, HostState, worst_first
from tuiprof.model.filter import FilterError, HostFilter
from tuiprof.model.messages import HangLevel, HangStatus
from tuiprof.model.settings import Settings
from tuiprof.model.summary import HostSummary
from tuiprof.model.values import Unavailable
from tuiprof.tui.host_grid import GridColumn, HostGrid
from tuiprof.tui.text import pair, reading, reasons, set_content, sparkline
from tuiprof.tui.screens.base import ConsoleScreen
from tuiprof.tui.source_features import FleetView

TREND_WIDTH = 12


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    priority: int
    """Higher stays longer in a narrow terminal (the host name always stays)."""
    cell: Callable[[HostState, ClusterState], Text | str]
    sort: Callable[[HostState], Any]


def _summary_cell(render: Callable[[HostSummary], Text]) -> Callable[[HostState, ClusterState], Text | str]:
    return lambda state, _: render(state.summary) if state.summary else ""


def _by(field: str) -> Callable[[HostState], tuple[int, float]]:
    """Sort on a summary figure; hosts without it sort after all that have it."""
    def key(state: HostState) -> tuple[int, float]:
        value = getattr(state.summary, field) if state.summary else Unavailable("")
        return (1, 0.0) if isinstance(value, Unavailable) else (0, float(value))
    return key


def _state_cell(state: HostState, cluster: ClusterState) -> Text:
    if state.reachable is None:
        return Text("connecting", style="dim")
    if not state.reachable:
        since = cluster.since_contact(state)
        return Text("DOWN" if since is None else f"DOWN {_short_age(since)}", style="bold red")
    level = state.summary.hang_level if state.summary else HangLevel.UNSPECIFIED
    if level == HangLevel.HUNG:
        return Text("HUNG", style="bold red")
    if level == HangLevel.SUSPECT:
        return Text("suspect", style="bold yellow")
    return Text("up", style="green")


def _short_age(seconds: float) -> str:
    """``12s``, ``5m``, ``3h``: time since last contact, to fit the State column."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 3600 else f"{seconds / 3600:.0f}h"


def _trend_series(state: HostState, cluster: ClusterState) -> str:
    """GPU utilization where the host has GPU samples, else CPU busy (the detail line says which)."""
    return "gpu_util" if cluster.history(state.address).numbers("gpu_util") else "cpu"


WORST_MARKER_NOTE = ("▼ the host most in need of attention (down, hung or suspect first, then the lowest "
                     "GPU utilization, then the slowest step); w jumps here")
TREND_NAMES = {"gpu_util": "mean GPU utilization", "cpu": "CPU busy (no GPU readings)"}


def _trend(state: HostState, cluster: ClusterState) -> Text:
    series = _trend_series(state, cluster)
    # fixed width, so the sparkline grows from the right; CPU in another colour than GPU
    line = sparkline(cluster.history(state.address).numbers(series), TREND_WIDTH, top=100.0).rjust(TREND_WIDTH)
    return Text(line, style="" if series == "gpu_util" else "cyan")


COLUMNS: tuple[Column, ...] = (
    Column("host", "Host", 12, 100, lambda s, _: s.name, lambda s: (0, s.name, s.address)),
    Column("state", "State", 10, 95, _state_cell, worst_first),
    Column("cpu", "CPU", 4, 60, _summary_cell(lambda m: reading(m.cpu_percent, units.percent)), _by("cpu_percent")),
    Column("mem", "Mem", 4, 55, _summary_cell(lambda m: reading(m.memory_percent, units.percent)), _by("memory_percent")),
    Column("gpus", "GPUs", 4, 30, _summary_cell(lambda m: reading(m.gpu_count, units.plain)), _by("gpu_count")),
    Column("util", "Util avg/min", 12, 90, _summary_cell(lambda m: pair(m.gpu_util_mean, m.gpu_util_min, units.percent)), _by("gpu_util_mean")),
    Column("sm", "SM avg/min", 10, 65, _summary_cell(lambda m: pair(m.sm_active_mean, m.sm_active_min, units.percent)), _by("sm_active_mean")),
    Column("power", "Power", 7, 35, _summary_cell(lambda m: reading(m.power_watts, units.watts)), _by("power_watts")),
    Column("gpumem", "GPU mem", 15, 40, _summary_cell(lambda m: pair(m.gpu_memory_used_bytes, m.gpu_memory_total_bytes, units.bytes_)), _by("gpu_memory_used_bytes")),
    Column("busbw", "NCCL busbw", 10, 45, _summary_cell(lambda m: reading(m.nccl_busbw_bytes_per_s, units.bytes_per_s)), _by("nccl_busbw_bytes_per_s")),
    Column("step", "Step", 8, 80, _summary_cell(lambda m: reading(m.step_time_seconds, units.seconds)), _by("step_time_seconds")),
    Column("trend", "Trend", TREND_WIDTH, 20, _trend, _by("gpu_util_mean")),
)


Flags = tuple[bool, bool, str]
"""What a row's cells depend on besides the host state: worst host, shared name, age if down."""


def _flags(state: HostState, worst_address: str | None, shared: set[str], cluster: ClusterState) -> Flags:
    """One host's flags (made for every host at every redraw: the age only for a host that is down)."""
    age = ""
    if state.reachable is False:
        since = cluster.since_contact(state)
        age = "" if since is None else _short_age(since)
    return (state.address == worst_address, state.name in shared, age)


def _host_label(state: HostState, flags: Flags) -> str:
    """The name, with the address when several agents share it, ▼ on the worst host."""
    worst, shared, _ = flags
    label = f"{state.name}@{state.address}" if shared else state.name
    return f"{label} ▼" if worst else label


class _LazyRows(Mapping[str, list]):
    """Host rows in display order; a row's cells are made only when asked for."""

    def __init__(self, screen: ClusterScreen, hosts: dict[str, HostState],
                 flags: dict[str, Flags]) -> None:
        self.screen, self.hosts, self.flags = screen, hosts, flags

    def __getitem__(self, address: str) -> list[Text | str]:
        return self.screen.cells(self.hosts[address], self.flags[address])

    def __iter__(self) -> Iterator[str]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)


SORT_KEYS = Binding.Group("Sort", compact=True)
"""`,` and `.` show as one footer entry (80 columns hold the footer only so)."""


class ClusterScreen(ConsoleScreen):
    """Every watched host at a glance."""

    BINDINGS = [
        Binding("enter", "open_host", "Host", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("comma", "sort(-1)", "Sort ←", key_display=",", group=SORT_KEYS),
        Binding("full_stop", "sort(1)", "Sort →", key_display=".", group=SORT_KEYS),
        Binding("I", "invert", "Invert", show=False),
        Binding("w", "worst", "Worst"),
        Binding("C", "columns", "Columns", show=False),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
        Binding("g", "edge(False)", "Top", show=False),
        Binding("G", "edge(True)", "Bottom", show=False),
    ]

    def __init__(self, settings: Settings = Settings()) -> None:
        super().__init__()
        keys = [column.key for column in COLUMNS]
        self.sort_column = keys.index(settings.sort) if settings.sort in keys else 0
        self.reverse = settings.reverse
        unused = [] if settings.sort in keys else [f"saved sort column '{settings.sort}' not known"]
        try:
            self.host_filter = HostFilter.parse(settings.filter)
        except FilterError as exc:  # a hand-edited file: start unfiltered rather than not at all
            self.host_filter = HostFilter.parse("")
            unused.append(f"saved filter not used: {exc}")
        self._settings_warning = "; ".join(unused)
        """What of the saved settings could not be used (said once the screen is up)."""
        self._row_cache: dict[str, tuple[HostState, Flags, list[Text | str]]] = {}
        """Per host: the state and flags its cells were made from, and the cells."""
        self._detail = ""
        self._worst: tuple[int, HostState | None] = (-1, None)
        """The worst host, and the cluster version it was found at."""
        self.grid = HostGrid([GridColumn(c.key, c.label, c.width, c.priority) for c in COLUMNS], id="hosts")
        """Made here, not in compose, so ``shows`` can answer before the screen is mounted."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="hang-banner", markup=False)  # data, not markup
        yield Static(id="slow-banner", markup=False)
        yield self.grid
        yield Static(id="detail", classes="detail", markup=False)  # data, not markup
        yield Input(placeholder="filter: name words and util<10 mem>90 hang=hung (Enter applies, Esc cancels)",
                    id="filter")
        yield Footer(compact=True, show_command_palette=False)  # 80 columns; ^p is in help

    def on_mount(self) -> None:
        self.grid.set_hidden(self._hidden_keys(self.console.hidden_columns("cluster")))
        if self._settings_warning:
            self.notify(self._settings_warning, title="Settings", severity="warning", markup=False)
        self.refresh_data()

    def on_screen_resume(self) -> None:
        self.refresh_data()

    @property
    def cluster(self) -> ClusterState:
        return self.console.cluster

    # ---------------------------------------------------------------- rendering

    def visible_hosts(self) -> list[HostState]:
        hosts = self.cluster.hosts()
        if self.host_filter.terms:
            hosts = [h for h in hosts if self.host_filter.matches(h)]
        column = COLUMNS[self.sort_column]
        return sorted(hosts, key=column.sort, reverse=self.reverse)

    def shows(self, address: str) -> bool:
        """Whether the host's row is on screen: only then is its new data worth a prompt redraw."""
        return self.grid.shows(address)

    def refresh_data(self) -> None:
        hosts = self.visible_hosts()
        worst = self.worst_host()
        shared = self.cluster.shared_names()
        worst_address = worst.address if worst is not None else None
        cluster = self.cluster
        flags: dict[str, Flags] = {}
        width = 12
        for h in hosts:
            flags[h.address] = host_flags = _flags(h, worst_address, shared, cluster)
            width = max(width, len(_host_label(h, host_flags)))
        # Rows are made lazily: the grid asks only for the rows it draws.
        self.grid.set_first_width(width)
        self.grid.set_rows(_LazyRows(self, {h.address: h for h in hosts}, flags))
        self._update_titles(len(hosts))
        self.update_detail()
        self.update_hang_banner()
        self.update_slow_banner()

    def _view_changed(self) -> None:
        """Redraw after a sort, invert or filter change, and remember the choice for the next console."""
        self.console.remember(sort=COLUMNS[self.sort_column].key, reverse=self.reverse, filter=self.host_filter.text)
        self.refresh_data()

    def update_hang_banner(self) -> None:
        """The job-wide hang line over the table: the worst level, since when, which ranks.

        Only hosts whose summary reports a suspect or hung rank are looked at (their full
        model built), so a healthy fleet costs nothing here.
        """
        affected = [
            (h.name, hang)
            for h in self.cluster.hosts()
            if h.summary is not None and h.summary.hang_level in (HangLevel.HUNG, HangLevel.SUSPECT)
            and (hang := self._hang_status(h)) is not None
        ]
        banner = hang_banner(affected, int(self.cluster.now * 1e9))
        widget = self.query_one("#hang-banner", Static)
        widget.display = banner is not None
        if banner is not None:
            widget.set_classes(f"hang-{banner.level}")
            set_content(widget, banner.text)

    def update_slow_banner(self) -> None:
        """The costliest slow job over the table: who the others wait for, what it costs, why."""
        banner = slow_banner(self.console.slowdowns.verdicts)
        source = self.console.source
        if banner is None and isinstance(source, FleetView):  # Prometheus mode: the agents' verdicts
            banner = fleet_slow_banner(source.slow_jobs())
        widget = self.query_one("#slow-banner", Static)
        widget.display = banner is not None
        if banner is not None:
            set_content(widget, banner.text)

    def _hang_status(self, state: HostState) -> HangStatus | None:
        """The host's verdict: from Prometheus in fleet mode (its hang series, read once per
        refresh for the troubled hosts), else, or for a host watched over gRPC, its snapshot's."""
        source = self.console.source
        status = source.hang(state.address) if isinstance(source, FleetView) else None
        if status is None and state.snapshot is not None:
            status = state.snapshot.hang
        return status

    def cells(self, state: HostState, flags: Flags) -> list[Text | str]:
        entry = self._row_cache.get(state.address)
        if entry is not None and entry[0] is state and entry[1] == flags:
            return entry[2]
        cells = self._row(state, flags)
        self._row_cache[state.address] = (state, flags, cells)
        return cells

    def _row(self, state: HostState, flags: Flags) -> list[Text | str]:
        worst, shared, _ = flags
        cells = [column.cell(state, self.cluster) for column in COLUMNS]
        cells[0] = _host_label(state, (False, shared, ""))
        if state.reachable is False:  # last known values, dimmed: they are stale
            cells = [Text(c.plain, style="dim") if isinstance(c, Text) else Text(c, style="dim")
                     for c in cells]
            cells[1] = _state_cell(state, self.cluster)
        if worst:
            cells[0] = Text(_host_label(state, flags), style="bold")
        return cells

    def worst_host(self) -> HostState | None:
        """The host most in need of attention, or None when no host stands out."""
        version = self.cluster.version
        if self._worst[0] != version:  # a redraw asks three times: the hosts are ranked once
            self._worst = (version, self._rank_worst())
        return self._worst[1]

    def _rank_worst(self) -> HostState | None:
        hosts = self.cluster.hosts()
        if len(hosts) < 2:
            return None
        # min and max, not a sort: this runs on every redraw of a ten-thousand-host table
        keys = list(map(worst_first, hosts))
        lowest = min(keys)
        return None if lowest == max(keys) else hosts[keys.index(lowest)]

    def _update_titles(self, shown: int) -> None:
        total = len(self.cluster.hosts())
        up = sum(1 for h in self.cluster.hosts() if h.reachable)
        column = COLUMNS[self.sort_column]
        arrow = "↓" if self.reverse else "↑"
        self.grid.mark_sorted(column.key, self.reverse)
        parts = [f"{up}/{total} hosts up", f"sort {column.label} {arrow}"]
        if self.worst_host() is not None:
            parts.append("▼ worst host (w)")
        if self.host_filter.text:
            parts.append(f"filter '{self.host_filter.text}': {shown} shown")
        self.sub_title = " · ".join(parts)

    def selected_address(self) -> str | None:
        return self.grid.cursor_key

    def update_detail(self) -> None:
        text = self.detail_text()
        if text != self._detail:  # new text means a new layout pass: only when it changed
            self._detail = text
            set_content(self.query_one("#detail", Static), text)

    def detail_text(self) -> str:
        address = self.selected_address()
        if address is None:
            return "no host matches the filter" if self.host_filter.text else "no hosts"
        state = self.cluster.host(address)
        label = state.name if state.name == address else f"{state.name} ({address})"
        since = self.cluster.since_contact(state)
        contact = "never answered" if since is None else f"last contact {units.ago(since)}"
        worst = self.worst_host()
        marker = [WORST_MARKER_NOTE] if worst is not None and worst.address == address else []
        if not state.reachable:
            what = "connecting" if state.reachable is None else f"unreachable: {state.error}"
            return "\n".join([f"{label}: {what} · {contact} · retrying with backoff (R: now)", *marker])
        lines = [f"{label}: up · {contact} · trend: {TREND_NAMES[_trend_series(state, self.cluster)]}", *marker]
        if state.summary is not None:
            named = {f: getattr(state.summary, f) for f in HostSummary.__dataclass_fields__}
            lines.extend(reasons(named))
        return "\n".join(lines)

    def on_host_grid_row_highlighted(self, _: HostGrid.RowHighlighted) -> None:
        self.update_detail()

    def on_host_grid_row_selected(self, _: HostGrid.RowSelected) -> None:
        self.action_open_host()

    # ---------------------------------------------------------------- actions

    def action_open_host(self) -> None:
        address = self.selected_address()
        if address is not None:
            self.console.show_host(address)

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.value = self.host_filter.text
        field.add_class("shown")
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.host_filter = HostFilter.parse(event.value)
        except FilterError as exc:
            self.notify(str(exc), title="Bad filter", severity="error", markup=False)
            return
        self._close_filter()
        self._view_changed()

    def _close_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.remove_class("shown")
        self.grid.focus()

    def action_clear_filter(self) -> None:
        if self.query_one("#filter", Input).has_class("shown"):
            self._close_filter()
            return
        if self.host_filter.text:
            self.host_filter = HostFilter.parse("")
            self._view_changed()

    def action_sort(self, step: int) -> None:
        self.sort_column = (self.sort_column + step) % len(COLUMNS)
        self._view_changed()

    def action_invert(self) -> None:
        self.reverse = not self.reverse
        self._view_changed()

    def action_worst(self) -> None:
        worst = self.worst_host()
        if worst is None:
            self.notify("no host stands out: all look alike")
            return
        if worst.address not in self.grid.keys:
            self.host_filter = HostFilter.parse("")
            self._view_changed()
        self.grid.move_cursor(self.grid.keys.index(worst.address))

    def action_columns(self) -> None:
        """The column chooser; hidden columns are saved by label, as in the other tables."""
        def apply(hidden: set[str]) -> None:
            self.grid.set_hidden(self._hidden_keys(hidden))

        self.console.choose_columns("cluster", "the host table", [c.label for c in COLUMNS], apply)

    @staticmethod
    def _hidden_keys(labels: set[str]) -> frozenset[str]:
        return frozenset(c.key for c in COLUMNS if c.label in labels)

    def action_cursor(self, step: int) -> None:
        self.grid.action_cursor(step)

    def action_edge(self, bottom: bool) -> None:
        self.grid.action_edge(bottom)

    def on_host_grid_header_selected(self, event: HostGrid.HeaderSelected) -> None:
        """Click a header to sort by it; click again to invert."""
        index = next(i for i, c in enumerate(COLUMNS) if c.key == event.column)
        if index == self.sort_column:
            self.reverse = not self.reverse
        self.sort_column = index
        self._view_changed()
