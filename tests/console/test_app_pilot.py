"""Every binding and action of the console, driven by Textual's Pilot over a recording."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from itertools import pairwise

import pytest

from textual.widgets import DataTable, Input, Static, TabbedContent

from console.recordings import AGENTS_RECORDING, replay_app
from tuiprof.model.events import SnapshotReceived
import tuiprof.tui.app as app_module
from tuiprof.tui.app import TuiprofApp
from tuiprof.tui.host_grid import HostGrid
from tuiprof.tui.screens.cluster import ClusterScreen
from tuiprof.tui.screens.help import HelpScreen
from tuiprof.tui.screens.host import HostScreen
from tuiprof.tui.screens.job_ops import JobOpsScreen
from tuiprof.tui.screens.stacks import StacksScreen
from tuiprof.tui.screens.traces import TracesScreen

SIZE = (120, 40)


async def settle(pilot, app: TuiprofApp) -> None:
    """Wait until the recording is applied and drawn (bounded), and the layout that drawing
    changed is done (the hang banner shows and moves the host grid down: a click aimed at the
    grid before that lands on the banner)."""
    for _ in range(100):
        await pilot.pause(0.02)
        if app.cluster.version and app._rendered_version == app.cluster.version and not app._inbox:
            await pilot.pause()
            return
    raise AssertionError("the recording was not rendered within 2 s")


def host_rows(app: TuiprofApp) -> list[str]:
    return app.screen.query_one("#hosts", HostGrid).keys


def cursor_host(app: TuiprofApp) -> str:
    return app.screen.selected_address()


def detail(app: TuiprofApp, selector: str = "#detail") -> str:
    return str(app.screen.query_one(selector, Static).render())


async def test_cluster_shows_every_host_with_its_state(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        assert isinstance(gpu_app.screen, ClusterScreen)
        assert host_rows(gpu_app) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
        grid = gpu_app.screen.query_one("#hosts", HostGrid)
        states = [str(grid.cell(h, "state")) for h in host_rows(gpu_app)]
        assert states == ["up", "up", "HUNG", "DOWN 1s"]  # down for 1 s when the recording ends
        assert "3/4 hosts up" in gpu_app.screen.sub_title


async def test_vim_keys_and_edges_move_the_cursor(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("j", "j")
        assert cursor_host(gpu_app) == "gpu-node-03"
        await pilot.press("k")
        assert cursor_host(gpu_app) == "gpu-node-02"
        await pilot.press("G")
        assert cursor_host(gpu_app) == "gpu-node-04"
        await pilot.press("g")
        assert cursor_host(gpu_app) == "gpu-node-01"


async def test_sort_column_and_invert(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("full_stop")  # sort by State: worst first
        assert host_rows(gpu_app)[:2] == ["gpu-node-04", "gpu-node-03"]
        assert "sort State ↑" in gpu_app.screen.sub_title
        await pilot.press("I")
        assert host_rows(gpu_app)[-2:] == ["gpu-node-03", "gpu-node-04"]
        assert "sort State ↓" in gpu_app.screen.sub_title
        await pilot.press("comma")  # back to Host, still inverted
        assert host_rows(gpu_app) == ["gpu-node-04", "gpu-node-03", "gpu-node-02", "gpu-node-01"]


async def test_filter_by_expression_and_name_then_clear(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("slash")
        field = gpu_app.screen.query_one("#filter", Input)
        assert field.has_focus
        await pilot.press(*"util<10", "enter")
        assert host_rows(gpu_app) == ["gpu-node-03"]
        assert "filter 'util<10': 1 shown" in gpu_app.screen.sub_title
        await pilot.press("slash", "ctrl+u", *"node-0", "enter")
        assert len(host_rows(gpu_app)) == 4
        await pilot.press("slash", "ctrl+u", *"02", "enter")
        assert host_rows(gpu_app) == ["gpu-node-02"]
        await pilot.press("escape")
        assert len(host_rows(gpu_app)) == 4


async def test_bad_filter_is_reported_and_keeps_the_input(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("slash", *"utl<3", "enter")
        field = gpu_app.screen.query_one("#filter", Input)
        assert field.has_focus and field.has_class("shown")
        messages = [n.message for n in gpu_app._notifications]
        assert any("unknown field 'utl'" in m for m in messages)
        await pilot.press("escape")
        assert not field.has_class("shown")
        assert len(host_rows(gpu_app)) == 4


async def test_worst_host_key_and_unreachable_detail(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("w")
        assert cursor_host(gpu_app) == "gpu-node-04"
        text = detail(gpu_app)
        assert "unreachable: cannot connect" in text and "last contact" in text and "ago" in text


async def test_enter_drills_into_host_tabs_and_escape_goes_back(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("j", "enter")
        await pilot.pause()
        screen = gpu_app.screen
        assert isinstance(screen, HostScreen) and screen.address == "gpu-node-02"
        tabs = screen.query_one("#tabs", TabbedContent)
        assert tabs.active == "gpus"
        assert screen.query_one("#gpus-table", DataTable).row_count == 8
        assert "PCIe rx, PCIe tx: n/a (kept off the hot path" in detail(gpu_app, "#host-detail")
        for key, tab in (("2", "cpu"), ("3", "io"), ("4", "ranks"), ("5", "pmu"), ("6", "history"), ("1", "gpus")):
            await pilot.press(key)
            assert tabs.active == tab
        await pilot.press("l")
        assert tabs.active == "cpu"
        await pilot.press("h", "h")
        assert tabs.active == "history"
        await pilot.press("4", "j")
        assert screen.query_one("#ranks-table", DataTable).cursor_row == 1
        assert "ops of rank 9" in str(screen.query_one("#rank-ops-title").render())
        ops = screen.query_one("#rank-ops-table", DataTable)
        assert [str(ops.get_row_at(i)[1]) for i in range(ops.row_count)] == ["cublasLtMatmul", "AllReduce"]
        await pilot.press("k")
        assert screen.query_one("#ranks-table", DataTable).cursor_row == 0
        await pilot.press("escape")
        assert isinstance(gpu_app.screen, ClusterScreen)


async def test_host_view_of_a_cpu_only_agent_says_why_gpus_are_missing() -> None:
    app = replay_app(AGENTS_RECORDING)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        grid = app.screen.query_one("#hosts", HostGrid)
        rows = host_rows(app)  # two agents on one machine: same hostname, told apart by address
        assert [str(grid.cell(h, "host")) for h in rows] == [f"{app.cluster.host(h).name}@{h}" for h in rows]
        assert {h.split(":")[0] for h in rows} == {"127.0.0.1", "127.0.0.2"}
        await pilot.press("enter")
        await pilot.pause()
        table = app.screen.query_one("#gpus-table", DataTable)
        assert str(table.get_cell_at((0, 0))).startswith("unavailable: NVML")
        await pilot.press("2")
        cores = app.screen.query_one("#cpu-table", DataTable)
        assert cores.row_count == 1 + 2  # total + this machine's 2 cores


async def test_job_ops_view_puts_the_straggler_first_and_enter_opens_its_host(gpu_app) -> None:
    async with gpu_app.run_test(size=(200, 50)) as pilot:  # wide enough for every column
        await settle(pilot, gpu_app)
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(gpu_app.screen, JobOpsScreen)
        table = gpu_app.screen.query_one("#ops", DataTable)
        first = [str(c) for c in table.get_row_at(0)]
        assert first[:3] == ["gpu-node-02", "rank 13", "nccl"] and "STRAGGLER" in first[-1]
        assert sum("STRAGGLER" in str(table.get_row_at(i)[-1]) for i in range(table.row_count)) == 1
        await pilot.press("j", "k", "enter")
        await pilot.pause()
        assert isinstance(gpu_app.screen, HostScreen) and gpu_app.screen.address == "gpu-node-02"
        assert gpu_app.screen.query_one("#tabs", TabbedContent).active == "ranks"
        await pilot.press("escape", "escape")
        assert isinstance(gpu_app.screen, ClusterScreen)


async def test_traces_stacks_and_help_screens_open_and_close(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        for key, screen_type in (("t", TracesScreen), ("s", StacksScreen), ("question_mark", HelpScreen)):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(gpu_app.screen, screen_type)
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(gpu_app.screen, ClusterScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        await pilot.press("q")  # closes help, does not quit
        await pilot.pause()
        assert isinstance(gpu_app.screen, ClusterScreen) and gpu_app.is_running


async def test_theme_toggle_and_quit(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        dark = gpu_app.current_theme.dark
        await pilot.press("T")
        assert gpu_app.current_theme.dark is not dark
        await pilot.press("T")
        assert gpu_app.current_theme.dark is dark
        await pilot.press("q")
        await pilot.pause()
        assert not gpu_app.is_running


async def test_command_palette_goes_to_a_host_and_to_a_rank(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"go to rank 13 on", "enter")
        for _ in range(50):
            await pilot.pause(0.05)
            if isinstance(gpu_app.screen, HostScreen):
                break
        assert isinstance(gpu_app.screen, HostScreen) and gpu_app.screen.address == "gpu-node-02"
        assert gpu_app.screen.query_one("#tabs", TabbedContent).active == "ranks"


async def test_mouse_header_click_sorts_and_row_click_moves_the_cursor(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        grid = gpu_app.screen.query_one("#hosts", HostGrid)
        cpu_x = 1 + sum(c.width + 2 for c in grid.columns[:2]) + 1  # inside the CPU header
        await pilot.click("#hosts", offset=(cpu_x, 0))
        await pilot.pause()
        assert "sort CPU ↑" in gpu_app.screen.sub_title
        assert host_rows(gpu_app)[0] == "gpu-node-03"  # 2% CPU, the lowest
        await pilot.click("#hosts", offset=(cpu_x, 0))
        await pilot.pause()
        assert "sort CPU ↓" in gpu_app.screen.sub_title
        await pilot.click("#hosts", offset=(3, 3))  # third row
        await pilot.pause()
        assert cursor_host(gpu_app) == host_rows(gpu_app)[2]


async def _render_times(app: TuiprofApp, pilot, host: str) -> tuple[list[float], float]:
    """Feed ``host`` a snapshot every 20 ms for 1 s (longer on a loaded machine: the feed's
    span is returned too); when did the screen redraw?"""
    renders: list[float] = []
    original = app.screen.refresh_data

    def counting() -> None:
        renders.append(asyncio.get_running_loop().time())
        original()

    app.screen.refresh_data = counting
    message = app.cluster.host(host).message  # its own: a new name would move its row
    start = app.cluster.now
    fed_from = asyncio.get_running_loop().time()
    for index in range(50):
        app._receive(SnapshotReceived(host, start + 1 + index, message))
        await pilot.pause(0.02)
    fed_for = asyncio.get_running_loop().time() - fed_from
    await pilot.pause(0.6)
    app.screen.refresh_data = original
    return renders, fed_for


async def test_updates_on_screen_are_drawn_at_most_ten_times_a_second_the_rest_twice() -> None:
    """Events are applied at once; a host whose row is on screen is redrawn promptly
    (at most 10 Hz), a host scrolled out of view only at the slow pace (at most 2 Hz)."""
    app = replay_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        message = app.cluster.host("gpu-node-01").message
        for index in range(100):  # more hosts than rows on screen
            app._receive(SnapshotReceived(f"zz-{index:03}", app.cluster.now, message))
        await settle(pilot, app)
        grid = app.screen.query_one("#hosts", HostGrid)
        on_screen, off_screen = grid.keys[0], grid.keys[-1]
        assert grid.shows(on_screen) and not grid.shows(off_screen)

        fast, _ = await _render_times(app, pilot, on_screen)
        slow, slow_fed_for = await _render_times(app, pilot, off_screen)
    for renders, least_gap in ((fast, 0.095), (slow, 0.45)):
        gaps = [b - a for a, b in pairwise(renders)]
        assert gaps and min(gaps) >= least_gap, (least_gap, gaps)
    # at 2 Hz, one render per half second of feeding and the last one after it (4 when the feed
    # took its 1 s; more only when a loaded machine stretched it)
    assert len(fast) >= 5 and 2 <= len(slow) <= 2 * slow_fed_for + 2, (len(fast), len(slow), slow_fed_for)


class QuietLiveSource:
    """A live source whose hosts never answer: the console just keeps running."""

    hosts = ["10.0.0.1:7000"]
    live = True

    async def run(self, emit) -> None:
        await asyncio.Event().wait()


async def test_live_console_takes_its_long_lived_objects_out_of_full_collections(monkeypatch) -> None:
    # Long enough that a loaded machine still checks "not yet" before the timer fires.
    monkeypatch.setattr(app_module, "FREEZE_AFTER_S", 2.0)
    gc.unfreeze()
    app = TuiprofApp(QuietLiveSource())
    try:
        async with app.run_test(size=SIZE) as pilot:
            assert gc.get_freeze_count() == 0
            for _ in range(60):  # up to 6 s
                await pilot.pause(0.1)
                if gc.get_freeze_count():
                    break
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


class FailingSource:
    """A source that fails the way a local agent that cannot start does."""

    hosts: list[str] = []
    live = True

    async def run(self, emit) -> None:
        from tuiprof.client.local import LocalAgentError

        raise LocalAgentError("cannot start the embedded agent: port 1779 in use")


async def test_a_failing_source_ends_the_console_with_its_reason() -> None:
    app = TuiprofApp(FailingSource())
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(50):
            await pilot.pause(0.02)
            if app.return_code is not None:
                break
        assert app.return_code == 1
        assert [str(m) for m in app._exit_renderables] == [
            "tuiprof: cannot start the embedded agent: port 1779 in use"]


async def test_space_pauses_and_resumes_a_replay_and_does_nothing_live() -> None:
    from console.recordings import GPU_FIXTURE
    from tuiprof.client.sources import ReplaySource
    from tuiprof.model import record

    events = list(record.read(GPU_FIXTURE))
    # at 4x: the fixture's 4 s of snapshots take about 1 s
    app = TuiprofApp(ReplaySource(events, speed=4.0))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        await pilot.press("space")
        replayed_to = time.strftime("%H:%M:%S UTC", time.gmtime(app._replayed_to))
        # The header's title (no screen sets its own): replay, paused, and the recorded time reached.
        assert app.source.paused and app.title == f"paused {replayed_to}"
        assert app.screen.title is None
        seen = app.cluster.version
        await pilot.pause(1.5)
        assert app.cluster.version == seen  # nothing moves while paused
        await pilot.press("space")
        assert not app.source.paused and app.title.startswith("replay ")
        for _ in range(100):
            await pilot.pause(0.05)
            if app.cluster.host("gpu-node-04").reachable is False:
                break
        assert app.cluster.host("gpu-node-04").reachable is False  # played on to the outage
    live = TuiprofApp(FailingSource())
    assert live.check_action("toggle_replay", ()) is False


async def test_brackets_in_data_and_input_are_shown_not_parsed_as_markup(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("slash", *"[/b]", "enter")  # a name word that looks like markup
        assert host_rows(gpu_app) == []
        assert "filter '[/b]': 0 shown" in gpu_app.screen.sub_title
        await pilot.press("slash", "ctrl+u", *"util<[/b]", "enter")  # an error message quoting it
        await pilot.pause()
        assert any("[/b]" in n.message for n in gpu_app._notifications)
        assert gpu_app.is_running


async def test_hang_banner_names_level_duration_and_host_and_only_shows_during_a_hang(gpu_app) -> None:
    async with gpu_app.run_test(size=SIZE) as pilot:
        await settle(pilot, gpu_app)
        banner = gpu_app.screen.query_one("#hang-banner", Static)
        assert banner.display and banner.has_class("hang-hung")
        text = str(banner.render())
        assert text.startswith("HUNG on 1 host for 1 min")
        assert "gpu-node-03: AllReduce #88120 on comm 9f3c1a in flight" in text
        assert "press s for merged stacks" in text

    healthy = replay_app(AGENTS_RECORDING)
    async with healthy.run_test(size=SIZE) as pilot:
        await settle(pilot, healthy)
        assert not healthy.screen.query_one("#hang-banner", Static).display


def plot_text(screen, selector: str) -> str:
    from tuiprof.tui.plots import HistoryPlot

    return str(screen.query_one(selector, HistoryPlot).render())


async def test_history_plots_have_a_time_axis_units_and_a_window_z_cycles(gpu_app) -> None:
    from tuiprof.tui.plots import HistoryPlot

    async with gpu_app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("enter", "6")
        await pilot.pause(0.2)
        screen = gpu_app.screen
        cpu = plot_text(screen, "#plot-cpu")
        assert "CPU busy (%) · window 5 min" in cpu
        assert "100%" in cpu and "0%" in cpu and "now" in cpu and "-1m" in cpu  # units up, time along
        per_gpu = plot_text(screen, "#plot-each-util")
        assert "GPU utilization per GPU (%)" in per_gpu and "gpu0" in per_gpu and "gpu7" in per_gpu
        assert "core0" in plot_text(screen, "#plot-each-busy")
        graphs = screen.query_one("#history-graphs")
        scrollbar_at = graphs.region.right - graphs.scrollbar_size_vertical
        assert graphs.scrollbar_size_vertical and all(  # a blank column between a plot's frame and the scrollbar
            plot.region.right < scrollbar_at for plot in screen.query(HistoryPlot) if plot.display)
        for window in ("15 min", "all", "1 min", "5 min"):
            await pilot.press("z")
            await pilot.pause(0.05)
            assert gpu_app.settings.history_window == window
            assert f"window {window}" in plot_text(screen, "#plot-power")
        await pilot.press("1", "z")  # from another tab: the plots come up
        assert screen.active_tab() == "history"


async def test_host_tables_drop_their_least_important_columns_at_80_columns(gpu_app) -> None:
    from tuiprof.tui.tables import FittedTable

    async with gpu_app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("enter")
        await pilot.pause(0.2)
        table = gpu_app.screen.query_one("#gpus-table", FittedTable)
        shown = table.shown_labels
        assert shown[0] == "GPU" and {"Util", "Memory"} <= set(shown) and "Mem clk" not in shown
        widths = sum(column.get_render_width(table) for column in table.columns.values())
        assert widths <= table.size.width
        await pilot.resize_terminal(250, 50)
        await pilot.pause(0.2)
        assert table.shown_labels == [c.label for c in table.all_columns]


async def test_the_column_chooser_hides_and_shows_columns_of_the_current_table(gpu_app) -> None:
    from textual.widgets import SelectionList

    from tuiprof.tui.columns import ColumnsScreen
    from tuiprof.tui.tables import FittedTable

    async with gpu_app.run_test(size=(200, 50)) as pilot:
        await settle(pilot, gpu_app)
        await pilot.press("C")
        assert isinstance(gpu_app.screen, ColumnsScreen)
        choices = gpu_app.screen.query_one(SelectionList)
        assert "Host" not in choices.selected and {"CPU", "Trend"} <= set(choices.selected)
        await pilot.press("down", "space")  # State is highlighted first; CPU is next
        assert "CPU" not in choices.selected and "State" in choices.selected
        await pilot.press("escape")
        grid = gpu_app.screen.query_one("#hosts", HostGrid)
        assert "cpu" not in [c.key for c in grid.shown_columns] and "CPU" not in visible_header(grid)
        assert gpu_app.settings.hidden_columns == ("cluster.CPU",)
        await pilot.press("enter", "2", "C")  # the host view's CPU tab: its own columns
        choices = gpu_app.screen.query_one(SelectionList)
        assert set(choices.selected) == {"Busy", "User", "System", "IO wait"}
        choices.deselect("System")
        await pilot.press("escape")
        table = gpu_app.screen.query_one("#cpu-table", FittedTable)
        assert table.shown_labels == ["CPU", "Busy", "User", "IO wait"]
        assert gpu_app.settings.hidden_columns == ("cluster.CPU", "cpu.System")
        await pilot.press("6", "C")
        assert isinstance(gpu_app.screen, HostScreen)  # plots have no columns to choose


def visible_header(grid: HostGrid) -> str:
    return grid.render_line(0).text


async def test_interval_keys_restart_the_streams_at_the_new_interval(tmp_path) -> None:
    """A real agent at 200 ms: `+` asks for one snapshot each 2 s instead, and the title says so."""
    from testkit.agents import running_agent
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.sources import LiveSource

    with running_agent(tmp_path, host="127.0.0.2", interval_ms=200) as agent:
        app = TuiprofApp(LiveSource([agent.address], ConnectionOptions()))
        host = agent.address.target
        async with app.run_test(size=SIZE) as pilot:
            assert app.title == "tuiprof · agent's interval"
            for _ in range(100):
                await pilot.pause(0.05)
                if len(app.cluster.history(host).points("memory")) >= 3:
                    break
            await pilot.press("plus")
            assert app.title == "tuiprof · every 2 s" and app.settings.interval_seconds == 2.0
            assert app.source.options.interval_ms == 2000
            await pilot.pause(0.5)  # the new stream is up
            before = len(app.cluster.history(host).points("memory"))
            await pilot.pause(3.0)
            assert len(app.cluster.history(host).points("memory")) - before <= 2  # 15 at the agent's 200 ms
            await pilot.press("minus", "minus")
            assert app.title == "tuiprof · every 0.5 s" and app.source.options.interval_ms == 500
    assert replay_app().check_action("interval", (1,)) is False  # a recording keeps its own pace


async def test_interval_keys_change_this_hosts_embedded_agent_in_place() -> None:
    """This host's embedded agent samples at the new interval from its next tick on, and stays the
    same host: restarting it would make it a new one (a new port)."""
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.sources import LocalSource

    source = LocalSource(ConnectionOptions(interval_ms=1000))
    app = TuiprofApp(source)

    async def snapshots_in(seconds: float) -> int:
        before = app.cluster.version
        await asyncio.sleep(seconds)
        return app.cluster.version - before

    async with app.run_test(size=SIZE) as pilot:
        for _ in range(250):
            await pilot.pause(0.04)
            if app.cluster.version >= 2:
                break
        [host] = app.cluster.addresses()
        assert app.title == "tuiprof · every 1 s"
        await pilot.press("minus", "minus")
        assert app.settings.interval_seconds == 0.25 and app.title == "tuiprof · every 0.25 s"
        assert app.source is source and source.options.interval_ms == 250 and app.connection is source.options
        await snapshots_in(1.2)  # the tick under way at 1 s ends
        assert await snapshots_in(2.0) >= 5  # 8 at 0.25 s; 2 at the old 1 s
        await pilot.press("plus", "plus", "plus")
        assert app.title == "tuiprof · every 2 s"
        await snapshots_in(1.0)
        assert await snapshots_in(4.0) <= 3  # 2 at 2 s; 16 at 0.25 s
        assert app.cluster.addresses() == [host] and app.cluster.host(host).reachable


async def test_this_hosts_agent_serves_grpc_only_from_the_first_call_the_console_makes() -> None:
    """Idle, gRPC's threads wake ~8 times a second: the embedded agent's port refuses connections
    while the console only watches (its snapshots come in-process), and serves from the first
    call the console makes to it (here stacks, key s), which is answered."""
    import socket

    from agentd.address import AgentAddress
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.sources import LocalSource

    app = TuiprofApp(LocalSource(ConnectionOptions(interval_ms=200)))

    def status() -> str:
        return str(app.screen.query_one("#stacks-status", Static).render()) if isinstance(app.screen, StacksScreen) else ""

    async with app.run_test(size=SIZE) as pilot:
        for _ in range(250):
            await pilot.pause(0.04)
            if app.cluster.version > 2:
                break
        [host] = app.cluster.addresses()
        address = AgentAddress.parse(host)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address.host, address.port), timeout=5).close()
        await pilot.press("s")
        for _ in range(250):
            await pilot.pause(0.04)
            if "taken in" in status() or "failed" in status():
                break
        assert "0 ranks on 1 host(s)" in status() and "no stacks from" not in status(), status()
        socket.create_connection((address.host, address.port), timeout=5).close()


async def test_this_hosts_agent_reads_the_pmu_only_while_its_tab_is_on_screen() -> None:
    """The embedded agent's host-wide PMU read costs ~1 ms a second on a 16-CPU VM: the console has
    it read only while the PMU tab is shown (tab 5), not on the other tabs, nor once the host view
    is left; the tab shows rates within seconds of opening."""
    from agentd.embedded import PMU_RESTING
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.sources import LocalSource

    app = TuiprofApp(LocalSource(ConnectionOptions(interval_ms=200)))

    async def until(condition, what: str) -> None:
        for _ in range(250):
            await pilot.pause(0.04)
            if condition():
                return
        raise AssertionError(f"not within 10 s: {what}")

    def resting() -> bool:
        snapshot = app.cluster.hosts()[0].snapshot if app.cluster.hosts() else None
        gap = snapshot.missing("pmu") if snapshot is not None else None
        return gap is not None and gap.reason == PMU_RESTING

    def pmu_cell() -> str:
        # Page faults, which any user can count: a user at perf_event_paranoid 2 counts user space only, where
        # no context switch happens, so that row says why it is unavailable instead of giving a rate.
        table = app.screen.query_one("#pmu-table", DataTable)
        keys = [row.key.value for row in table.ordered_rows]
        return str(table.get_row_at(keys.index("page_faults_per_s"))[1]) if "page_faults_per_s" in keys else ""

    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.cluster.version > 0 and app._rendered_version == app.cluster.version,
                    "a first snapshot drawn")
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, HostScreen), "the host view")
        assert app.screen.active_tab() == "gpus"
        await until(resting, "the PMU resting on the GPU tab")
        await pilot.press("5")
        await until(lambda: pmu_cell().endswith("/s"), "page faults a second on the PMU tab")
        assert not resting()
        await pilot.press("1")
        await until(resting, "the PMU resting again once tab 1 is shown")
        await pilot.press("5")
        await until(lambda: not resting(), "the PMU read again on tab 5")
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)
        await until(resting, "the PMU resting once the host view is left")
    # the agent stops with the console (Textual does not wait for its worker at exit: the app does)
    assert not [thread for thread in threading.enumerate() if thread.name == "embedded-agentd"]


async def drawing_steps(events: list, monkeypatch) -> tuple[list[str], int]:
    """What a console over ``events`` did with its news, in order ("timer": waited to gather more,
    "drawn": drew it), and how many hosts it watched."""
    from tuiprof.client.sources import ReplaySource

    app = TuiprofApp(ReplaySource(events, speed=0))
    steps: list[str] = []
    set_timer, render_views = app.set_timer, app.render_views
    monkeypatch.setattr(app, "set_timer", lambda delay, callback, **kw: (
        steps.append("timer") if callback == app._timed_render else None) or set_timer(delay, callback, **kw))
    monkeypatch.setattr(app, "render_views", lambda force=False: (
        steps.append("drawn") if app.cluster.version != app._rendered_version else None) or render_views(force))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
    return steps, len(app.cluster.addresses())


async def test_one_watched_host_is_drawn_as_its_news_comes_several_are_gathered_first(monkeypatch) -> None:
    """Agents on one interval answer in a burst, so a change waits ``GATHER_S`` for the rest of the
    burst; with one host there is no burst, and that timer would only wake the loop once more a
    second (the embedded console's case): its first news is drawn at once."""
    from tuiprof.model import record

    events = list(record.read(AGENTS_RECORDING))
    one_host = [event for event in events if event.host == events[0].host]
    for recorded, first_step in ((one_host, "drawn"), (events, "timer")):
        steps, hosts = await drawing_steps(recorded, monkeypatch)
        assert steps and steps[0] == first_step, f"{hosts} host(s): {steps}"


async def ticks_and_news(source, seconds: float, monkeypatch) -> tuple[list[float], list[float]]:
    """When a console over ``source`` ticked its clock, and when it drew news (not a tick), in ``seconds``."""
    app = TuiprofApp(source)
    ticks: list[float] = []
    news: list[float] = []
    tick, render_views = app._tick, app.render_views
    monkeypatch.setattr(app, "_tick", lambda: ticks.append(time.monotonic()) or tick())
    monkeypatch.setattr(app, "render_views", lambda force=False: (
        news.append(time.monotonic()) if not force and app.cluster.version != app._rendered_version else None)
        or render_views(force))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(seconds)
    return ticks, news


async def test_the_live_clock_ticks_only_when_nothing_was_drawn_for_a_tick(monkeypatch) -> None:
    """With no news the console still advances its clock and draws every ``TICK_S`` ("last
    contact N s ago" counts); news drawn puts the tick off by ``FIRST_TICK_S``, so a console fed
    every ``TICK_S`` or faster never wakes for it (one wakeup a second less, ~0.1 ms of CPU on a
    GPU VM)."""
    from tuiprof.client.channel import ConnectionOptions
    from tuiprof.client.sources import LocalSource

    ratio = app_module.FIRST_TICK_S / app_module.TICK_S
    cases = ((QuietLiveSource(), None, 0.3), (LocalSource(ConnectionOptions(interval_ms=100)), 100, 0.3),
             (LocalSource(ConnectionOptions(interval_ms=1000)), 1000, app_module.TICK_S))  # the default interval
    for source, interval_ms, tick_s in cases:
        monkeypatch.setattr(app_module, "TICK_S", tick_s)
        monkeypatch.setattr(app_module, "FIRST_TICK_S", tick_s * ratio)
        ticks, news = await ticks_and_news(source, max(2.0, 5 * tick_s), monkeypatch)
        if interval_ms is None:
            assert len(ticks) >= 4, ticks  # 6 in 2 s (0.45 s, then every 0.3 s), fewer on a loaded machine
            continue
        assert len(news) >= max(2.0, 5 * tick_s) * 1000 / interval_ms * 0.6, (interval_ms, news)
        assert len(ticks) <= 1, f"fed every {interval_ms} ms, the clock still ticked {len(ticks)} times"
        for at in ticks:
            before = [t for t in news if t < at]
            assert not before or at - before[-1] >= ratio * tick_s - 0.02, "a tick came less than FIRST_TICK_S after news"


@pytest.mark.parametrize(("recording", "host", "tab"), [("agents", "127.0.0.1:33905", "cpu"),
                                                          ("gpu", "gpu-node-01", "gpus")])
async def test_the_only_host_opens_on_its_host_view(recording, host, tab) -> None:
    """`tuiprof` watching one host starts on that host's view (a cluster table of one row is an empty
    screen); a host without GPUs on its CPU tab."""
    from console.recordings import GPU_FIXTURE
    from tuiprof.client.sources import ReplaySource
    from tuiprof.model import record

    path = AGENTS_RECORDING if recording == "agents" else GPU_FIXTURE
    events = [e for e in record.read(path) if e.host == host]
    assert any(isinstance(e, SnapshotReceived) for e in events)
    app = TuiprofApp(ReplaySource(events, speed=0), open_only_host=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        assert isinstance(app.screen, HostScreen) and app.screen.address == host
        assert app.screen.active_tab() == tab
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)  # the cluster view is one key away, and stays


async def test_several_hosts_start_on_the_cluster_view_even_when_asked_to_open_the_only_one() -> None:
    app = replay_app(AGENTS_RECORDING)
    app._open_only_host = True
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        assert isinstance(app.screen, ClusterScreen) and len(app.cluster.hosts()) == 2
