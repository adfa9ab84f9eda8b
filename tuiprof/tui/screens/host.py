"""Host view: per GPU, per core, NICs and disks, per rank, PMU, and history graphs."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Header, Label, Static, TabbedContent, TabPane

from agentd.address import AgentAddress
from tuiprof.analysis.rank_health import rank_notes, telemetry_off
from tuiprof.client.function_timing import outcome_text, parse_switch, switch_function_timing
from tuiprof.errors import TuiprofError
from tuiprof.model import units
from tuiprof.model.cluster import ClusterState, HostState
from tuiprof.model.messages import GpuProcess, GpuStats, HostSnapshot, PmuStats, RankState, RankStats
from tuiprof.model.values import Reading, Unavailable
from tuiprof.tui.function_switch import FunctionSwitchScreen
from tuiprof.tui.messages import PmuShown
from tuiprof.tui.plots import MAX_LINES, WINDOW_NAMES, HistoryPlot, Line, busiest
from tuiprof.tui.tables import FittedTable, TableColumn
from tuiprof.tui.text import pair, reading, reasons, set_content
from tuiprof.tui.screens.base import ConsoleScreen

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TABS = ("gpus", "cpu", "io", "ranks", "pmu", "history")
DETAIL_LINES = 4
"""Lines of the detail bar (its height in the stylesheet)."""

Cell = Text | str
Row = tuple[str, list[Cell], dict[str, Reading]]
"""Row key, cells, and the readings whose unavailability the detail line explains."""


def gpu_rows(snapshot: HostSnapshot) -> list[Row]:
    rows: list[Row] = []
    for g in snapshot.gpus:
        throttle = ", ".join(g.clock_event_reasons) or ("none" if not isinstance(g.clock_event_reasons_mask, Unavailable) else units.NA)
        rows.append((f"gpu{g.index}", [
            str(g.index), g.name,
            reading(g.utilization_percent, units.percent),
            reading(g.sm_active_percent, units.percent),
            reading(g.sm_occupancy_percent, units.percent),
            reading(g.tensor_active_percent, units.percent),
            pair(g.memory_used_bytes, g.memory_total_bytes, units.bytes_),
            pair(g.power_watts, g.power_limit_watts, units.watts),
            reading(g.temperature_celsius, units.celsius),
            reading(g.sm_clock_hz, units.hertz),
            reading(g.memory_clock_hz, units.hertz),
            throttle,
            pair(g.nvlink_rx_bytes_per_s, g.nvlink_tx_bytes_per_s, units.bytes_per_s),
            pair(g.pcie_rx_bytes_per_s, g.pcie_tx_bytes_per_s, units.bytes_per_s),
        ], _readings(g)))
    return rows


GPU_COLUMNS = (
    TableColumn("GPU", 100), TableColumn("Name", 20), TableColumn("Util", 90), TableColumn("SM act", 80),
    TableColumn("SM occ", 40), TableColumn("Tensor", 45), TableColumn("Memory", 85),
    TableColumn("Power/limit", 70), TableColumn("Temp", 60), TableColumn("SM clk", 30),
    TableColumn("Mem clk", 25), TableColumn("Throttle", 50), TableColumn("NVLink rx/tx", 35),
    TableColumn("PCIe rx/tx", 33),
)
"""Each column's priority: at a narrow width the lowest go first."""


PROCESS_COLUMNS = ("PID", "User", "Process", "GPU memory", "Share", "SM", "CPU", "Host mem", "Time", "Rank", "Job",
                   "Where", "Command")
"""What the agent reports per GPU process (NVML's compute processes and /proc: its CPU use in % of
one CPU, resident memory and time since it started, as nvitop shows them), the rank whose pid it
is, and where it runs (container, pod, SLURM job; its pid in there)."""


def _text(value: str | Unavailable) -> Text | str:
    return Text(units.NA, style="dim italic") if isinstance(value, Unavailable) else value


def _where(process: GpuProcess | RankStats) -> Text | str:
    """Its container, pod or SLURM job and its pid in there; ``host`` (dim) when none."""
    return process.where or Text("host", style="dim italic")


def gpu_process_rows(gpu: GpuStats, ranks: Sequence[RankStats], at_unix_seconds: float) -> list[Row]:
    """The GPU's compute processes, biggest memory first; a pid that is a rank names its rank and job.
    ``at_unix_seconds``: when the snapshot was taken (a process's time is counted up to then)."""
    by_pid = {rank.pid: rank for rank in ranks}
    rows: list[Row] = []
    by_memory = sorted(gpu.processes, reverse=True, key=lambda p: -1.0 if isinstance(
        p.used_memory_bytes, Unavailable) else float(p.used_memory_bytes))
    for process in by_memory:
        rank = by_pid.get(process.pid)
        used = process.used_memory_bytes
        share = (units.percent(100.0 * used / gpu.memory_total_bytes)
                 if not isinstance(used, Unavailable) and not isinstance(gpu.memory_total_bytes, Unavailable)
                 and gpu.memory_total_bytes > 0 else units.NA)
        started = process.start_time_unix_seconds
        running = started if isinstance(started, Unavailable) else max(0.0, at_unix_seconds - started)
        named: dict[str, Reading] = {"GPU memory": used, "SM": process.sm_percent, "CPU": process.cpu_percent,
                                     "Host mem": process.resident_memory_bytes, "Time": started}
        named |= {name: text for name, text in (("User", process.user), ("Command", process.command))
                  if isinstance(text, Unavailable)}
        rows.append((str(process.pid), [
            str(process.pid), _text(process.user), process.name or Text("not visible", style="dim italic"),
            reading(used, units.bytes_), share, reading(process.sm_percent, units.percent),
            reading(process.cpu_percent, units.percent), reading(process.resident_memory_bytes, units.bytes_),
            reading(running, units.elapsed),
            rank.label if rank else Text("not a rank", style="dim italic"),
            (rank.job_id or Text("none", style="dim italic")) if rank else "",
            _where(process), _text(process.command),
        ], named))
    return rows


def processes_age(gpu: GpuStats) -> str:
    """`` · read 3 s ago (every 5 s)``: the agent reads a GPU's processes slower than its other figures."""
    age, every = gpu.processes_age_seconds, gpu.processes_interval_seconds
    if isinstance(age, Unavailable) or isinstance(every, Unavailable):
        return ""  # an agent that reads them every interval, or a read that failed (the notes say why)
    return f" · read {age:.0f} s ago (every {every:.0f} s)"


def process_notes(rows: Sequence[Row]) -> str:
    """Why the processes' n/a cells are n/a, by column: ``pid 5200: User, Command: n/a (reason)``."""
    notes = []
    for key, _, named in rows:
        notes += [f"pid {key}: {note}" for note in reasons(named)]
    return "; ".join(notes)


def _readings(message: DataclassInstance) -> dict[str, Reading]:
    """The readings among a model message's fields (numbers and Unavailable; not flags, text or nested)."""
    values = {field.name: getattr(message, field.name) for field in dataclasses.fields(message)}
    return {name: value for name, value in values.items()
            if isinstance(value, (int, float, Unavailable)) and not isinstance(value, bool)}


CORE_COLUMNS = (TableColumn("CPU", 100), TableColumn("Busy", 90), TableColumn("User", 70),
                TableColumn("System", 60), TableColumn("IO wait", 50))


def core_rows(snapshot: HostSnapshot) -> list[Row]:
    cpu = snapshot.cpu
    rows: list[Row] = [("all", [
        "all", reading(cpu.busy_percent, units.percent), reading(cpu.user_percent, units.percent),
        reading(cpu.system_percent, units.percent), reading(cpu.iowait_percent, units.percent),
    ], _readings(cpu))]
    for core in cpu.cores:
        rows.append((f"cpu{core.cpu}", [
            str(core.cpu), reading(core.busy_percent, units.percent),
            reading(core.user_percent, units.percent), reading(core.system_percent, units.percent),
            reading(core.iowait_percent, units.percent),
        ], _readings(core)))
    return rows


IO_COLUMNS = (TableColumn("Device", 100), TableColumn("Read/Rx", 90), TableColumn("Write/Tx", 85),
              TableColumn("Read/Write IOPS", 60), TableColumn("Busy", 70), TableColumn("Errors rx/tx", 50))


def io_rows(snapshot: HostSnapshot) -> list[Row]:
    rows: list[Row] = []
    for nic in snapshot.nics:
        rows.append((f"nic {nic.name}", [
            f"nic {nic.name}", reading(nic.rx_bytes_per_s, units.bytes_per_s),
            reading(nic.tx_bytes_per_s, units.bytes_per_s), "", "",
            pair(nic.rx_errors_total, nic.tx_errors_total, units.plain),
        ], _readings(nic)))
    for disk in snapshot.disks:
        rows.append((f"disk {disk.name}", [
            f"disk {disk.name}", reading(disk.read_bytes_per_s, units.bytes_per_s),
            reading(disk.write_bytes_per_s, units.bytes_per_s),
            pair(disk.read_iops, disk.write_iops, lambda v: units.per_s(v, "")),
            reading(disk.busy_percent, units.percent), "",
        ], _readings(disk)))
    return rows


RANK_COLUMNS = (
    TableColumn("Rank", 100), TableColumn("PID", 60), TableColumn("Job", 55), TableColumn("Where", 45),
    TableColumn("State", 95), TableColumn("Steps", 50), TableColumn("Step time", 90), TableColumn("GEMM", 70),
    TableColumn("busbw (kernel)", 75), TableColumn("Oldest in flight", 80), TableColumn("Heartbeat", 40),
    TableColumn("Top function", 35), TableColumn("Device memory", 30),
)


def rank_keys(ranks: Sequence[RankStats]) -> list[str]:
    """One row key per rank process: its label, with the pid where two jobs share a rank number."""
    counts = collections.Counter(rank.label for rank in ranks)
    return [rank.label if counts[rank.label] == 1 else f"{rank.label} (pid {rank.pid})" for rank in ranks]


def rank_rows(snapshot: HostSnapshot) -> list[Row]:
    rows: list[Row] = []
    for key, rank in zip(rank_keys(snapshot.ranks), snapshot.ranks, strict=True):
        job = rank.job_id or Text("none", style="dim italic")
        rows.append((key, [
            key, str(rank.pid), job, _where(rank), _rank_state(rank), str(rank.step_count),
            reading(rank.step_time_seconds, units.seconds), *_hook_cells(rank),
            units.seconds(rank.heartbeat_age_seconds), _top_function(rank), _device_memory(rank),
        ], _readings_but_placement(rank)))
    return rows


_COPY_SHORT = {"host_to_device": "H2D", "device_to_host": "D2H", "device_to_device": "D2D"}


def _device_memory(rank: RankStats) -> Cell:
    """PyTorch's caching allocator (allocated/reserved) and the rank's copy rates per direction."""
    memory = rank.device_memory
    parts = []
    if not isinstance(memory.allocated_bytes, Unavailable) and not isinstance(memory.reserved_bytes, Unavailable):
        parts.append(f"{units.bytes_(memory.allocated_bytes)}/{units.bytes_(memory.reserved_bytes)}")
    for copies in memory.copies:
        rate = copies.bytes_per_s
        if copies.direction in _COPY_SHORT and not isinstance(rate, Unavailable) and rate > 0:
            parts.append(f"{_COPY_SHORT[copies.direction]} {units.bytes_per_s(rate)}")
    return " ".join(parts) if parts else Text("none", style="dim italic")


def _top_function(rank: RankStats) -> Cell:
    """The timed Python function the rank spent most time in per second (its qualified name), or,
    before rates exist, the one with the most time in all."""
    if not rank.functions:
        return Text("none", style="dim italic")
    rated = [(f.seconds_per_s, f.name) for f in rank.functions if not isinstance(f.seconds_per_s, Unavailable)]
    if rated:
        per_s, name = max(rated)
        return f"{name.partition(':')[2]} {units.seconds(per_s)}/s"
    top = max(rank.functions, key=lambda f: f.seconds_total)
    return f"{top.name.partition(':')[2]} {units.seconds(top.seconds_total)} in all"


def _readings_but_placement(rank: RankStats) -> dict[str, Reading]:
    """The rank's readings for its n/a notes, less its pid in a container: the Where column says
    where it runs, and a rank on the host has no such pid by design, not for want of a reading."""
    readings = _readings(rank)
    del readings["pid_in_container"]
    return readings


def _hook_cells(rank: RankStats) -> list[Cell]:
    """GEMM, NCCL busbw and oldest in flight: the hook library's figures, or why it has none."""
    off = telemetry_off(rank)
    if off:
        return [Text(off, style="dim italic"), "", ""]
    busbw = [op.busbw_bytes_per_s for op in rank.nccl if not isinstance(op.busbw_bytes_per_s, Unavailable)]
    oldest = rank.oldest_inflight
    return [
        reading(rank.gemm_tflops, units.tflops),
        reading(sum(busbw) / len(busbw), units.bytes_per_s) if busbw else Text(units.NA, style="dim italic"),
        f"{oldest.op} #{oldest.sequence} {units.seconds(oldest.age_seconds)}" if oldest else "none",
    ]


OP_COLUMNS = (
    TableColumn("Kind", 100), TableColumn("Op", 95), TableColumn("Detail", 30), TableColumn("Calls/s", 60),
    TableColumn("p50", 80), TableColumn("p99", 85), TableColumn("Max", 50), TableColumn("Throughput", 90),
)
PMU_COLUMNS = (TableColumn("Counter", 100), TableColumn("Value", 90))
PROCESS_PRIORITY = {"PID": 100, "Process": 90, "GPU memory": 80, "SM": 75, "Rank": 70, "CPU": 68, "User": 65,
                    "Job": 60, "Host mem": 58, "Where": 55, "Share": 50, "Time": 45, "Command": 40}
"""Priorities of ``PROCESS_COLUMNS`` (a column not listed goes first)."""


def op_rows(rank: RankStats) -> list[Row]:
    """Every GEMM and NCCL op of one rank, with its latency and throughput."""
    rows: list[Row] = []
    for op in rank.gemm:
        rows.append((f"gemm {op.op} {op.dtype} {op.shape}", [
            "gemm", op.op, f"{op.dtype} {op.shape}".strip(), units.per_s(op.count_per_s, ""),
            reading(op.latency.p50_seconds, units.seconds), reading(op.latency.p99_seconds, units.seconds),
            reading(op.latency.max_seconds, units.seconds), reading(op.tflops, units.tflops),
        ], {**_readings(op), **_readings(op.latency)}))
    for nccl in rank.nccl:
        parts = (nccl.dtype, nccl.algorithm, nccl.protocol, f"comm {nccl.comm_hash}×{nccl.comm_size}")
        detail = " ".join(p for p in parts if p)
        rows.append((f"nccl {nccl.op} {nccl.dtype} {nccl.comm_hash}", [
            "nccl", nccl.op, detail, units.per_s(nccl.count_per_s, ""),
            reading(nccl.latency.p50_seconds, units.seconds), reading(nccl.latency.p99_seconds, units.seconds),
            reading(nccl.latency.max_seconds, units.seconds), reading(nccl.busbw_bytes_per_s, units.bytes_per_s),
        ], {**_readings(nccl), **_readings(nccl.latency)}))
    return rows


def _swap(used: Reading, total: Reading) -> str:
    if total == 0:
        return "no swap"
    return f"swap {units.bytes_(used)}/{units.bytes_(total)}"


def _rank_state(rank: RankStats) -> Text:
    style = "green" if rank.state == RankState.RUNNING else "bold red"
    return Text(rank.state or "unknown", style=style)


PMU_FIELDS: tuple[tuple[str, str, Callable[[Reading], str]], ...] = (
    ("mips", "instructions (millions/s)", lambda v: units.plain(v, 0)),
    ("mega_cycles_per_s", "cycles (millions/s)", lambda v: units.plain(v, 0)),
    ("ipc", "instructions per cycle", units.plain),
    ("cache_misses_per_s", "cache misses", units.per_s),
    ("cache_miss_percent", "cache misses of references", units.percent),
    ("branch_misses_per_s", "branch misses", units.per_s),
    ("task_clock_cpus", "CPUs busy (task clock)", units.plain),
    ("context_switches_per_s", "context switches", units.per_s),
    ("page_faults_per_s", "page faults", units.per_s),
    ("cpu_migrations_per_s", "CPU migrations", units.per_s),
)
PMU_SCOPES = {
    "system": "host-wide: every CPU, every process",
    "process": "per process: the ranks' own processes only (host-wide needs root, CAP_PERFMON or "
               "perf_event_paranoid <= 0)",
}


def pmu_rows(pmu: PmuStats) -> list[Row]:
    """The counters with what they count over (host or ranks); an unavailable one says why in place."""
    rows: list[Row] = [
        ("scope", ["counted over", PMU_SCOPES.get(pmu.scope, pmu.scope or "not reported")], {}),
        ("hardware", ["hardware counters", "yes" if pmu.hardware_available
                      else f"no: {pmu.hardware_reason or 'not reported'}"], {})]
    for name, label, formatter in PMU_FIELDS:
        value = getattr(pmu, name)
        cell = Text(f"{units.NA}: {value.reason}", style="dim italic") if isinstance(value, Unavailable) \
            else reading(value, formatter)
        rows.append((name, [label, cell], {name: value}))
    return rows


Plot = tuple[str, str, Callable[[Reading], str], float | None]
HISTORY_SERIES: tuple[Plot, ...] = (
    ("cpu", "CPU busy (%)", units.percent, 100.0),
    ("memory", "memory used (%)", units.percent, 100.0),
    ("gpu_util", "GPU utilization, mean of the GPUs (%)", units.percent, 100.0),
    ("sm_active", "SM active, mean of the GPUs (%)", units.percent, 100.0),
    ("power", "GPU power, all GPUs (W)", units.watts, None),
    ("busbw", "NCCL bus bandwidth from kernel time, mean (B/s)", units.bytes_per_s, None),
    ("step", "step time, median rank (s)", units.seconds, None),
)
"""Host-wide series: key, title with the unit, tick formatter, and the top of the scale (None: the
series' own max)."""
DETAIL_SERIES: tuple[Plot, ...] = (
    ("util", "GPU utilization per GPU (%)", units.percent, 100.0),
    ("memory", "GPU memory used per GPU (%)", units.percent, 100.0),
    ("power", "GPU power per GPU (W)", units.watts, None),
    ("busy", "CPU busy per core (%)", units.percent, 100.0),
)
"""Per-GPU (``gpuN.util``) and per-core (``coreN.busy``) series of ``plots.detail_samples``: the
part after the dot, the title, tick formatter and top of the scale."""


def _table_name(table: FittedTable) -> str:
    """The table's name in the saved hidden columns: ``gpus``, ``rank-ops``…"""
    return (table.id or "").removesuffix("-table")


def _title(state: HostState) -> str:
    return state.name if state.name == state.address else f"{state.name} ({state.address})"


TAB_KEYS = Binding.Group("Tabs", compact=True)
"""1-6 show as one footer entry (the tab bar names them)."""
LOWER_TABLES = {"gpus": ("gpu-procs-table", "the GPU's processes"), "ranks": ("rank-ops-table", "the rank's ops")}
"""The tabs with a second table below the first (for the highlighted row): its id and title."""


class HostScreen(ConsoleScreen):
    """Everything one agent reports, in tabs (1-6 switch, Esc goes back)."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("1", "tab('gpus')", "GPUs", group=TAB_KEYS),
        Binding("2", "tab('cpu')", "CPU", group=TAB_KEYS),
        Binding("3", "tab('io')", "Net/Disk", group=TAB_KEYS),
        Binding("4", "tab('ranks')", "Ranks", group=TAB_KEYS),
        Binding("5", "tab('pmu')", "PMU", group=TAB_KEYS),
        Binding("6", "tab('history')", "History", group=TAB_KEYS),
        Binding("z", "window", "Zoom", tooltip="Zoom the plots' time window: 1 min, 5 min, 15 min, all"),
        Binding("C", "columns", "Columns", show=False),
        Binding("c", "columns(True)", "Lower table's columns", show=False,
                tooltip="Columns of the table below (GPU processes, rank ops)"),
        Binding("f", "time_functions", "Time functions",
                tooltip="Start (name) or stop (-name) timing Python functions in the highlighted rank"),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
        Binding("h", "next_tab(-1)", "Prev tab", show=False),
        Binding("l", "next_tab(1)", "Next tab", show=False),
    ]

    def __init__(self, address: str, tab: str | None = None) -> None:
        super().__init__()
        self.address = address
        self.initial_tab = tab or "gpus"
        self._rows: dict[str, list[Row]] = {}
        self._drawn_state: HostState | None = None
        """The host state the tables were last filled from (a tab shown later is filled when shown)."""

    @property
    def cluster(self) -> ClusterState:
        return self.console.cluster

    def shows(self, address: str) -> bool:
        """Only this host's own data changes what this screen draws."""
        return address == self.address

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="host-summary", classes="summary", markup=False)  # data, not markup
        with TabbedContent(initial=self.initial_tab, id="tabs"):
            for tab, title, columns in (
                ("gpus", "GPUs", GPU_COLUMNS), ("cpu", "CPU", CORE_COLUMNS),
                ("io", "Net/Disk", IO_COLUMNS), ("ranks", "Ranks", RANK_COLUMNS),
                ("pmu", "PMU", PMU_COLUMNS),
            ):
                with TabPane(title, id=tab):
                    yield FittedTable(columns, id=f"{tab}-table")
                    if tab == "gpus":  # the highlighted GPU's processes below its row
                        yield Label(id="gpu-procs-title", classes="graph-label", markup=False)
                        procs = FittedTable([TableColumn(label, PROCESS_PRIORITY.get(label, 0))
                                             for label in PROCESS_COLUMNS], id="gpu-procs-table", cursor=False)
                        procs.can_focus = False  # focus stays on the GPU rows (and leaves the tab with them)
                        yield procs
                    if tab == "ranks":  # the highlighted rank's ops below its row
                        yield Label(id="rank-ops-title", classes="graph-label", markup=False)
                        yield FittedTable(OP_COLUMNS, id="rank-ops-table", cursor=False)
            with TabPane("History", id="history"), VerticalScroll(id="history-graphs"):
                for series, *_ in HISTORY_SERIES:
                    yield HistoryPlot(id=f"plot-{series}")
                for series, *_ in DETAIL_SERIES:
                    yield HistoryPlot(id=f"plot-each-{series}")
        yield Static(id="host-detail", classes="detail", markup=False)
        yield Footer(compact=True, show_command_palette=False)  # 80 columns; ^p is in help

    def on_mount(self) -> None:
        for table in self.query(FittedTable):
            table.set_hidden(self.console.hidden_columns(_table_name(table)))
        self.refresh_data()

    def on_screen_resume(self) -> None:
        self.refresh_data()
        self.post_message(PmuShown(self.active_tab() == "pmu"))

    def on_screen_suspend(self) -> None:
        self.post_message(PmuShown(False))

    def refresh_data(self) -> None:
        """Redraw from the host's state. The tables and the detail line only when the state is
        new: the console also redraws once a second with no news, for "last contact N s ago"
        and the plots' time axis, and rows made again from the same snapshot would not change."""
        state = self.cluster.host(self.address)
        self.sub_title = state.name
        set_content(self.query_one("#host-summary", Static), self.summary_text(state))
        if state is not self._drawn_state:
            self._drawn_state = state
            self._fill_tab()
            self.update_detail()
        self._fill_history()

    def _fill_tab(self) -> None:
        """The tables of the tab on screen (the others are filled when they are shown)."""
        snapshot = self.cluster.host(self.address).snapshot
        if snapshot is None:
            return
        tab = self.active_tab()
        if tab == "gpus":
            self._fill("gpus", gpu_rows(snapshot), snapshot.missing("gpu"), "no GPUs")
            self._fill_gpu_processes(snapshot)
        elif tab == "cpu":
            self._fill("cpu", core_rows(snapshot), snapshot.missing("host"), "no CPU readings")
        elif tab == "io":
            self._fill("io", io_rows(snapshot), snapshot.missing("host"), "no NICs or disks")
        elif tab == "ranks":
            self._fill("ranks", rank_rows(snapshot), snapshot.missing("ranks"),
                       "no training processes (start them with `tuiprof run -- CMD`)")
            self._fill_rank_ops(snapshot)
        elif tab == "pmu":
            self._fill("pmu", pmu_rows(snapshot.pmu), snapshot.missing("pmu"), "no PMU readings")

    def summary_text(self, state: HostState) -> str:
        since = self.cluster.since_contact(state)
        # An agent answering every second is redrawn at ages from 0 to ~1 s: "just now" for
        # both, or the line flips between "just now" and "1 s ago" (and is resent) every second.
        fresh = 2.0 if state.reachable else 1.0
        contact = "never answered" if since is None else f"last contact {units.ago(since, fresh)}"
        if not state.reachable:
            what = "connecting" if state.reachable is None else f"UNREACHABLE: {state.error}"
            head = f"{_title(state)} · {what} · {contact}"
            return head + ("\nshowing the last snapshot received" if state.snapshot else "")
        info = state.info
        versions = ""
        if info is not None:
            driver = f"driver {info.driver_version}" if info.driver_version else "no NVIDIA driver"
            versions = f" · agent {info.agent_version} · {info.cpu_count} CPUs · {driver}"
        load = ""
        if state.snapshot is not None:
            cpu = state.snapshot.cpu
            load = f"\nload {units.plain(cpu.load1)} {units.plain(cpu.load5)} {units.plain(cpu.load15)}"
            memory = state.snapshot.memory
            load += f" · memory {units.bytes_(memory.used_bytes)}/{units.bytes_(memory.total_bytes)}"
            load += f" · {_swap(memory.swap_used_bytes, memory.swap_total_bytes)}"
            if state.snapshot.hang.level:
                load += f" · hang: {state.snapshot.hang.level} {state.snapshot.hang.explanation}".rstrip()
        return f"{_title(state)} · up · {contact}{versions}{load}"

    def _fill(self, tab: str, rows: list[Row], missing: Unavailable | None, empty: str) -> None:
        table = self.query_one(f"#{tab}-table", FittedTable)
        if not rows:
            note = f"unavailable: {missing.reason}" if missing else empty
            rows = [("none", [Text(note, style="dim italic")] + [""] * (len(table.all_columns) - 1), {})]
        self._rows[tab] = rows
        table.show_rows({key: cells for key, cells, _ in rows})

    def _fill_rank_ops(self, snapshot: HostSnapshot) -> None:
        table = self.query_one("#rank-ops-table", FittedTable)
        rank = self._highlighted_rank(snapshot)
        title = self.query_one("#rank-ops-title", Label)
        if rank is None:
            set_content(title, "")
            table.show_rows({})
            return
        job = f", job {rank.job_id}" if rank.job_id else ""
        set_content(title, f"GEMM and NCCL ops of {rank.label} (pid {rank.pid}{job})")
        empty = telemetry_off(rank) or "no ops recorded yet"
        rows = op_rows(rank) or [("none", [Text(empty, style="dim italic")]
                                  + [""] * (len(OP_COLUMNS) - 1), {})]
        table.show_rows({key: cells for key, cells, _ in rows})

    def _fill_gpu_processes(self, snapshot: HostSnapshot) -> None:
        table = self.query_one("#gpu-procs-table", FittedTable)
        title = self.query_one("#gpu-procs-title", Label)
        cursor = self.query_one("#gpus-table", DataTable).cursor_row
        table.display = title.display = 0 <= cursor < len(snapshot.gpus)  # no GPU: the note above says why
        if not table.display:
            return
        gpu = snapshot.gpus[cursor]
        rows = gpu_process_rows(gpu, snapshot.ranks, snapshot.timestamp_unix_ns / 1e9)
        notes = process_notes(rows)
        set_content(title, f"Processes on GPU {gpu.index}{processes_age(gpu)}" + (f" · {notes}" if notes else ""))
        rows = rows or [
            ("none", [Text("no compute processes", style="dim italic")] + [""] * (len(PROCESS_COLUMNS) - 1), {})]
        table.show_rows({key: cells for key, cells, _ in rows})

    def _fill_history(self) -> None:
        """The plots, drawn only while the History tab shows (a plot costs a full redraw)."""
        if self.active_tab() != "history":
            return
        history = self.cluster.history(self.address)
        now, window = self.cluster.now, self.console.settings.history_window
        for series, title, formatter, top in HISTORY_SERIES:
            line = Line(title, history.points(series))
            self.query_one(f"#plot-{series}", HistoryPlot).show(title, [line], formatter, top, now, window)
        detail = self.console.detail_history.get(self.address)
        for part, title, formatter, top in DETAIL_SERIES:
            names = [name for name in detail.series("") if name.endswith(f".{part}")] if detail else []
            lines = [Line(name.split(".")[0], detail.points(name)) for name in names] if detail else []
            kept = busiest(lines)
            if len(kept) < len(lines):
                title = f"{title}, the {MAX_LINES} busiest of {len(lines)}"
            self.query_one(f"#plot-each-{part}", HistoryPlot).show(title, kept, formatter, top, now, window)

    def active_tab(self) -> str:
        return self.query_one("#tabs", TabbedContent).active

    def update_detail(self) -> None:
        """Why the highlighted row's n/a cells are n/a; for a rank, its telemetry's health first."""
        tab = self.active_tab()
        text = ""
        if tab in self._rows:
            table = self.query_one(f"#{tab}-table", DataTable)
            rows = self._rows[tab]
            if rows and 0 <= table.cursor_row < len(rows):
                key, _, readings = rows[table.cursor_row]
                lines = self._rank_notes() if tab == "ranks" else []
                text = "\n".join(f"{key}: {line}" for line in (lines + reasons(readings))[:DETAIL_LINES])
        set_content(self.query_one("#host-detail", Static), text)

    def _highlighted_rank(self, snapshot: HostSnapshot) -> RankStats | None:
        """The rank process of the highlighted row, found by its row key (not its position)."""
        rows = self._rows.get("ranks", [])
        cursor = self.query_one("#ranks-table", DataTable).cursor_row
        if not 0 <= cursor < len(rows):
            return None
        by_key = dict(zip(rank_keys(snapshot.ranks), snapshot.ranks, strict=True))
        return by_key.get(rows[cursor][0])

    def _rank_notes(self) -> list[str]:
        snapshot = self.cluster.host(self.address).snapshot
        rank = self._highlighted_rank(snapshot) if snapshot is not None else None
        return rank_notes(rank) if rank is not None else []

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        snapshot = self.cluster.host(self.address).snapshot
        if event.data_table.id == "ranks-table" and snapshot is not None:
            self._fill_rank_ops(snapshot)
        if event.data_table.id == "gpus-table" and snapshot is not None:
            self._fill_gpu_processes(snapshot)
        self.update_detail()

    def on_tabbed_content_tab_activated(self, _: TabbedContent.TabActivated) -> None:
        self.post_message(PmuShown(self.active_tab() == "pmu"))
        self.refresh_bindings()  # `c` exists on the tabs with a lower table only
        self._fill_tab()
        self._fill_history()
        self.update_detail()

    def action_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab
        if tab != "history":
            self.query_one(f"#{tab}-table", DataTable).focus()

    def action_next_tab(self, step: int) -> None:
        index = (TABS.index(self.active_tab()) + step) % len(TABS)
        self.action_tab(TABS[index])

    def action_window(self) -> None:
        """The next time window of the plots (1 min, 5 min, 15 min, all); remembered."""
        index = WINDOW_NAMES.index(self.console.settings.history_window)
        self.console.remember(history_window=WINDOW_NAMES[(index + 1) % len(WINDOW_NAMES)])
        self.action_tab("history")
        self._fill_history()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`c` (the lower table's columns) only where the tab has a lower table."""
        if action == "columns" and parameters == (True,):
            return self.is_mounted and self.active_tab() in LOWER_TABLES
        if action == "time_functions":
            return self.is_mounted and self.active_tab() == "ranks"
        return True

    def action_time_functions(self) -> None:
        """Ask for names, then send them to the highlighted rank's agent; the outcome as a notification
        (and in the rank's detail lines, from its next snapshot)."""
        snapshot = self.cluster.host(self.address).snapshot
        rank = self._highlighted_rank(snapshot) if snapshot is not None else None
        if rank is None:
            self.notify("highlight a rank first", severity="warning")
            return
        pid = rank.pid

        def send(text: str | None) -> None:
            if text:
                self._switch_functions(pid, text)

        self.app.push_screen(FunctionSwitchScreen(f"pid {pid} on {self.address}"), send)

    @work(group="function-timing", exit_on_error=False)
    async def _switch_functions(self, pid: int, text: str) -> None:
        try:
            start, stop = parse_switch(text)
            outcome = await switch_function_timing(AgentAddress.parse(self.address), self.console.connection, pid,
                                                   start, stop)
        except TuiprofError as exc:
            self.notify(str(exc), title="Time functions", severity="error", markup=False)
            return
        self.notify(outcome_text(outcome, start, stop), title="Time functions", markup=False,
                    severity="information" if outcome.acknowledged and not outcome.problems else "warning")

    def action_columns(self, lower: bool = False) -> None:
        """The column chooser over the current tab's table, or the one below it (``lower``);
        on History: nothing to choose."""
        tab = self.active_tab()
        if tab == "history":
            self.notify("the History tab has plots, not columns")
            return
        table_id, title = LOWER_TABLES[tab] if lower else (f"{tab}-table", f"the {tab} table")
        table = self.query_one(f"#{table_id}", FittedTable)
        self.console.choose_columns(_table_name(table), title, [c.label for c in table.all_columns],
                                    table.set_hidden)

    def action_cursor(self, step: int) -> None:
        tab = self.active_tab()
        if tab == "history":
            return
        table = self.query_one(f"#{tab}-table", DataTable)
        table.action_cursor_down() if step > 0 else table.action_cursor_up()
