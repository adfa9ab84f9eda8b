"""The console repaints only what changed: a table row whose cells changed, a line whose text changed.

Textual's own ``DataTable.update_cell`` and ``Static.update`` repaint the whole widget, which a
terminal receives every second (bench/console/console_nvitop.md)."""

from __future__ import annotations

from rich.style import Style
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import DataTable, Static
from textual.widgets.data_table import RowKey

from tuiprof.tui.tables import sync_rows
from tuiprof.tui.text import set_content


class Tables(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable(id="t")
        yield Static(id="line")


async def open_first_host(app, pilot):
    """Enter on the cluster view's first row: its host view, once shown."""
    from tuiprof.tui.screens.host import HostScreen

    await pilot.pause(0.2)
    await pilot.press("enter")
    await pilot.pause(0.1)
    assert isinstance(app.screen, HostScreen)
    return app.screen


def recording_refreshes(widget) -> list[tuple[Region, ...]]:
    """Every ``refresh`` call of ``widget`` from now on: the regions it named (none: the whole widget)."""
    calls: list[tuple[Region, ...]] = []
    original = widget.refresh

    def refresh(*regions, **kwargs):
        calls.append(regions)
        return original(*regions, **kwargs)

    widget.refresh = refresh
    return calls


async def test_a_changed_cell_repaints_its_row_only_and_unchanged_rows_nothing() -> None:
    app = Tables()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one(DataTable)
        table.add_columns("GPU", "Util", "Power")
        rows = {"0": ["0", "97%", "651 W"], "1": ["1", "12%", "90.0 W"]}
        sync_rows(table, rows)
        await pilot.pause()
        calls = recording_refreshes(table)
        sync_rows(table, rows)
        assert calls == []  # the same rows: nothing to repaint
        sync_rows(table, {"0": ["0", "98%", "652 W"], "1": ["1", "12%", "90.0 W"]})
        assert [str(table.get_cell_at((0, c))) for c in range(3)] == ["0", "98%", "652 W"]
        [(region,)] = calls  # one repaint, of one region: row 0's line
        assert region.height == 1 and region.y == table._get_row_region(0).y - table.scroll_offset.y


async def test_the_same_text_is_not_repainted() -> None:
    app = Tables()
    async with app.run_test(size=(80, 20)):
        line = app.query_one("#line", Static)
        set_content(line, "load 1.00 · memory 3 GiB")
        calls = recording_refreshes(line)
        set_content(line, "load 1.00 · memory 3 GiB")
        assert calls == []
        set_content(line, "load 1.10 · memory 3 GiB")
        assert len(calls) == 1 and str(line.render()) == "load 1.10 · memory 3 GiB"


def test_ages_change_in_whole_seconds_and_a_fresh_host_stays_just_now() -> None:
    from tuiprof.model.units import ago

    assert ago(3.7) == ago(3.1) == "3 s ago"
    assert ago(0.2, 2.0) == ago(1.5, 2.0) == "just now"  # a reachable agent answering every second
    assert ago(1.5) == "1 s ago"


def rendered_cells(table: DataTable) -> dict[tuple, object]:
    """The table's cached cell renderings of its current version: (row key, column key) -> lines."""
    cache = table._cell_render_cache
    return {key[:2]: cache.get(key) for key in cache.keys() if key[6] == table._update_count}  # noqa: SIM118 (an LRUCache: not iterable)


async def test_a_changed_cell_is_rendered_anew_and_its_row_neighbours_come_from_the_cache() -> None:
    app = Tables()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one(DataTable)
        table.add_columns("GPU", "Util", "Power")
        sync_rows(table, {"0": ["0", "97%", "651 W"], "1": ["1", "12%", "90.0 W"]})
        await pilot.pause()  # the table grows to its rows: a resize, after which every cell is drawn anew
        table.refresh()
        await pilot.pause()
        cached = rendered_cells(table)
        assert len(cached) == 9  # header and two rows, three columns
        sync_rows(table, {"0": ["0", "98%", "651 W"], "1": ["1", "12%", "90.0 W"]})
        await pilot.pause()
        line = table.render_line(table._get_row_region(0).y).text
        assert "98%" in line and "97%" not in line
        after = rendered_cells(table)
        kept = {cell for cell in cached if after.get(cell) is cached[cell]}
        # Every cell but row 0's Util keeps the rendering it had: Rich renders one cell, not the table.
        assert kept == set(cached) - {(RowKey("0"), list(table.columns)[1])}


async def test_text_that_takes_the_same_room_repaints_without_a_layout_pass() -> None:
    app = Tables()
    async with app.run_test(size=(80, 20)) as pilot:
        line = app.query_one("#line", Static)
        set_content(line, "load 1.00 · memory 3 GiB")
        await pilot.pause()
        layouts: list[bool] = []
        original = line.refresh

        def refresh(*regions, **kwargs):
            layouts.append(kwargs.get("layout", False))
            return original(*regions, **kwargs)

        line.refresh = refresh
        set_content(line, "load 1.10 · memory 3 GiB")  # one line, as before: the screen's layout holds
        set_content(line, "load 1.10\nmemory 3 GiB")  # two lines: the widget grows
        set_content(line, "x" * 81)  # wider than the terminal: it wraps
        assert layouts == [False, True, True]
        await pilot.pause()
        assert line.size.height == 2 and str(line.render()) == "x" * 81


async def test_the_host_views_redraw_without_news_makes_no_rows_and_a_new_snapshot_does(monkeypatch) -> None:
    """Once a second the console redraws even when no snapshot came ("last contact N s ago"):
    the host view's rows come from the snapshot, so they are made again only for a new one."""
    from console.recordings import replay_app
    from tuiprof.model.events import SnapshotReceived
    from tuiprof.tui.screens import host

    made: list[str] = []
    original = host.gpu_rows
    monkeypatch.setattr(host, "gpu_rows", lambda snapshot: made.append(snapshot.hostname) or original(snapshot))
    app = replay_app()
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_first_host(app, pilot)
        assert made
        made.clear()
        app.render_views(force=True)
        app.render_views(force=True)
        assert made == []
        latest = app.cluster.host(screen.address)
        assert latest.message is not None
        app.cluster.apply(SnapshotReceived(screen.address, app.cluster.now + 1, latest.message))
        app.render_views()
        assert made == [latest.message.hostname]


class Fitted(App[None]):
    def compose(self) -> ComposeResult:
        from tuiprof.tui.tables import FittedTable, TableColumn

        yield FittedTable([TableColumn("Rank", 100), TableColumn("State", 90), TableColumn("Note", 80)], id="t")


async def test_a_fitted_tables_cells_look_as_datatable_draws_them() -> None:
    """FittedTable makes a one-line cell's segments itself (tables.py): character for character and
    style for style what DataTable's own rendering gives, on the cursor row, zebra rows, the fixed
    column, for plain text, a styled text and spans."""
    from rich.segment import Segment
    from rich.text import Text

    from tuiprof.tui.tables import FittedTable

    app = Fitted()
    async with app.run_test(size=(80, 12)) as pilot:
        table = app.query_one(FittedTable)
        spans = Text("rank ") + Text("3", style="bold red")
        table.show_rows({"a": ["rank 0", Text("running", style="green"), "ok"],
                         "b": [spans, Text("n/a", style="dim italic"), ""],
                         "c": ["rank 12", "stopped", Text("far from the median", style="reverse")]})
        await pilot.pause()
        compared = 0
        for row in range(table.row_count):
            for column in range(len(table.columns)):
                width = list(table.columns.values())[column].get_render_width(table)
                for cursor in (False, True):
                    style = table._get_row_style(row, table.rich_style)
                    ours = table._render_cell(row, column, style, width, cursor)
                    table._cell_render_cache.clear()
                    textuals = DataTable._render_cell(table, row, column, style, width, cursor)
                    table._cell_render_cache.clear()

                    def cells(lines: list[list[Segment]]) -> list[tuple[str, object]]:
                        return [(char, segment.style) for line in lines for segment in line for char in segment.text]

                    assert cells(ours) == cells(textuals), (row, column, cursor)
                    compared += 1
        assert compared == 18


async def test_the_op_views_redraw_without_news_makes_no_rows(monkeypatch) -> None:
    """The NCCL/GEMM view's rows come from every host's snapshot: made again only when one changed."""
    from console.recordings import replay_app
    from tuiprof.model.events import SnapshotReceived
    from tuiprof.tui.screens import job_ops

    made: list[int] = []
    original = job_ops.job_ops
    monkeypatch.setattr(job_ops, "job_ops", lambda cluster: made.append(cluster.version) or original(cluster))
    app = replay_app()
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("n")
        await pilot.pause(0.1)
        assert isinstance(app.screen, job_ops.JobOpsScreen) and made
        made.clear()
        app.render_views(force=True)
        assert made == []
        [host, *_] = app.cluster.hosts()
        assert host.message is not None
        app.cluster.apply(SnapshotReceived(host.address, app.cluster.now + 1, host.message))
        app.render_views()
        assert made == [app.cluster.version]


async def test_a_repaint_of_many_changed_rows_looks_up_the_tables_styles_and_columns_once(monkeypatch) -> None:
    """DataTable looks up its own, its background's, the fixed column's and the stripe's styles for
    every line it draws, each a walk over every ancestor's styles (``DOMNode.rich_style``): 64
    walks for 16 changed rows; and it lists its columns in order three times a line. FittedTable
    lists its columns once per repaint and looks each style up once until it is restyled
    (tables.py): the next repaints walk no styles at all."""
    from textual.dom import DOMNode

    from tuiprof.tui.tables import FittedTable

    walks: list[DOMNode] = []
    walk = DOMNode.rich_style.fget
    monkeypatch.setattr(DOMNode, "rich_style", property(lambda node: walks.append(node) or walk(node)))
    listings: list[DataTable] = []
    columns_of = DataTable.ordered_columns.fget
    monkeypatch.setattr(DataTable, "ordered_columns",
                        property(lambda table: listings.append(table) or columns_of(table)))

    def rows(value: str) -> dict[str, list[str]]:
        return {f"r{i}": [f"rank {i}", value, "ok"] for i in range(16)}

    app = Fitted()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one(FittedTable)
        table.show_rows(rows("running"))
        await pilot.pause()
        table.notify_style_update()  # as Textual restyles it: its styles are looked up again
        walks.clear()
        table.show_rows(rows("stopped"))
        listings.clear()
        await pilot.pause()
        repaint_walks, repaint_listings = len(walks), len(listings)
        assert all("stopped" in table.render_line(table._get_row_region(i).y).text for i in range(16))
        # One walk per style (own, header, fixed, two stripes, the cursor's two), not four a line.
        assert 0 < repaint_walks <= 7
        assert repaint_listings == 1  # 64 without
        walks.clear()
        table.show_rows(rows("running"))
        await pilot.pause()
        assert all("running" in table.render_line(table._get_row_region(i).y).text for i in range(16))
        assert walks == []  # the styles of the repaint before


async def test_a_restyled_table_draws_with_its_new_styles() -> None:
    """The styles FittedTable keeps between repaints are those a fresh lookup gives after each way
    Textual restyles a table: a theme, focus leaving it, a class on an ancestor; and its lines are
    drawn with them (not those of before)."""
    from textual.widgets import Input

    from tuiprof.tui.tables import FittedTable

    class FittedAndInput(Fitted):
        CSS = "Screen.dim FittedTable { background: red; }"

        def compose(self) -> ComposeResult:
            yield from super().compose()
            yield Input(id="i")

    def fresh(table: FittedTable, names: tuple[str, ...]) -> Style:
        return DataTable.get_component_styles(table, *names).rich_style

    names = [("datatable--even-row",), ("datatable--odd-row",), ("datatable--header",), ("datatable--cursor",)]
    app = FittedAndInput()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one(FittedTable)
        table.show_rows({f"r{i}": [f"rank {i}", "running", "ok"] for i in range(4)})
        table.focus()
        await pilot.pause()
        seen = [list(table.render_line(1))[-1].style]
        for restyle in (lambda: setattr(app, "theme", "textual-light"), lambda: app.query_one(Input).focus(),
                        lambda: app.screen.add_class("dim")):
            before = {n: table.get_component_styles(*n).rich_style for n in names}, table.rich_style
            restyle()
            await pilot.pause()
            await pilot.pause()
            after = {n: table.get_component_styles(*n).rich_style for n in names}, table.rich_style
            assert after != before
            assert after == ({n: fresh(table, n) for n in names}, DataTable.rich_style.fget(table))
            assert table.background_colors == DataTable.background_colors.fget(table)
            seen.append(list(table.render_line(1))[-1].style)
        assert len(set(seen)) == 4, seen  # each restyle drew the row anew


async def test_changed_rows_are_repainted_in_one_request_each_where_datatable_puts_it() -> None:
    """DataTable's ``refresh_row`` places a row by adding up every row above it and asks for each
    repaint apart; the changed rows go in one request (tables.py), each region the one DataTable
    gives that row, and a row scrolled out of the window asks for none."""
    from tuiprof.tui.tables import FittedTable

    def rows(value: str) -> dict[str, list[str]]:
        return {f"r{i}": [f"rank {i}", value if i % 3 else "running", "ok"] for i in range(30)}

    app = Fitted()
    async with app.run_test(size=(80, 20)) as pilot:
        table = app.query_one(FittedTable)
        table.show_rows(rows("running"))
        await pilot.pause()
        table.scroll_to(y=5, animate=False)
        await pilot.pause()
        calls = recording_refreshes(table)
        table.show_rows(rows("stopped"))
        window = table.window_region
        expected = [table._get_row_region(i) for i in range(30) if i % 3]
        [regions] = calls
        assert list(regions) == [r.translate(-table.scroll_offset) for r in expected if window.overlaps(r)]
        assert 0 < len(regions) < len(expected)  # some changed rows are out of the window


async def test_a_cells_neighbouring_segments_of_one_style_are_one() -> None:
    """Padding, text and fill of a plain cell share their style: one segment, not three, for every
    line drawn from the cell cache to join, crop and compare (tables.py)."""
    from rich.text import Text

    from tuiprof.tui.tables import FittedTable

    app = Fitted()
    async with app.run_test(size=(80, 12)) as pilot:
        table = app.query_one(FittedTable)
        table.show_rows({"a": ["rank 0", "running", "ok"], "b": ["rank 1", Text("n/a", style="dim italic"), "ok"]})
        await pilot.pause()
        width = list(table.columns.values())[1].get_render_width(table)
        [plain] = table._render_cell(0, 1, table._get_row_style(0, table.rich_style), width)
        [styled] = table._render_cell(1, 1, table._get_row_style(1, table.rich_style), width)
        assert [s.text for s in plain] == [" running "]
        assert [s.text for s in styled] == [" ", "n/a", "     "]


async def test_a_new_snapshot_on_the_gpus_tab_builds_only_the_sections_it_draws(monkeypatch) -> None:
    """The console's model of a snapshot is built section by section as the view reads it
    (``convert.NestedOnFirstRead``): the GPUs tab and the summary build the GPUs, their processes
    and the ranks' own fields, not the ranks' ops, the cores, NICs or disks; the Ranks tab does."""
    from console.recordings import replay_app
    from tuiprof.model import convert
    from tuiprof.model.events import SnapshotReceived

    built: list[str] = []
    original = convert.from_proto

    def counting(cls, *args, **kwargs):
        built.append(cls.__name__)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(convert, "from_proto", counting)
    app = replay_app()
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_first_host(app, pilot)
        assert screen.active_tab() == "gpus"
        message = app.cluster.host(screen.address).message
        assert message is not None and message.ranks[0].gemm and message.ranks[0].nccl and message.cpu.cores
        built.clear()
        app.cluster.apply(SnapshotReceived(screen.address, app.cluster.now + 1, message))
        app.render_views()
        assert {"HostSnapshot", "GpuStats", "GpuProcess", "RankStats", "CpuStats"} <= set(built)
        assert built.count("GpuStats") == len(message.gpus) and built.count("RankStats") == len(message.ranks)
        assert not {"GemmOpStats", "NcclOpStats", "CpuCoreStats", "NicStats", "DiskStats"} & set(built)
        built.clear()
        await pilot.press("4")  # the Ranks tab: the highlighted rank's ops
        await pilot.pause(0.1)
        assert {"GemmOpStats", "NcclOpStats"} <= set(built)
