"""Every function of tuiprof.tui.textual_compat against real Textual objects: a Textual upgrade that
moves one of the internals the console reaches for fails here, by the function's name."""

from __future__ import annotations

import inspect

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.drivers.linux_driver import LinuxDriver
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

from tuiprof.tui import textual_compat as compat


class OneTable(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable()


def fill(table: DataTable) -> None:
    table.add_columns("gpu", "util")
    table.add_row(Text("0"), Text("98%"), key="0")
    table.add_row(Text("1"), Text("12%"), key="1")


async def test_the_app_has_its_driver_once_running() -> None:
    app = OneTable()
    assert compat.app_driver(app) is None
    async with app.run_test():
        assert compat.app_driver(app) is not None


async def test_a_drivers_writes_go_through_the_replacement() -> None:
    app = OneTable()
    async with app.run_test():
        driver = compat.app_driver(app)
        assert driver is not None
        written: list[str] = []
        compat.replace_driver_write(driver, written.append)
        driver.write("frame")
        assert written == ["frame"]


async def test_the_input_parser_and_clock_are_textuals_own() -> None:
    assert compat.input_parser_as_expected()
    driver = LinuxDriver(OneTable())
    assert not compat.key_thread_running(driver)  # not started
    parser = compat.key_parser(driver)
    assert compat.escape_due(parser) is None
    list(parser.feed("\x1b"))  # a lone Esc: the Escape key only once no sequence follows it in time
    due = compat.escape_due(parser)
    assert isinstance(due, float) and due >= compat.textual_clock()
    assert inspect.signature(LinuxDriver.run_input_thread).parameters.keys() == {"self"}  # replaced in driver.py


async def test_cells_are_found_read_and_replaced_in_the_table_store() -> None:
    app = OneTable()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        fill(table)
        await pilot.pause()
        util = list(table.columns)[1]
        assert compat.cell_keys(table, 0, 1) == (RowKey("0"), util)
        assert compat.cell_keys(table, -1, 1)[0] is None  # the header row
        assert compat.cell_at(table, RowKey("0"), util) == Text("98%")
        assert compat.row_label_width(table) == 0  # no row labels
        compat.replace_cells(table, {"0": {util: Text("97%")}})
        assert table.get_cell("0", util) == Text("97%")


async def test_the_render_cache_key_is_the_one_datatable_files_cells_under() -> None:
    """DataTable's own ``_render_cell`` (not tuiprof's FittedTable) files a rendered cell in its
    cache; the key made here must find it, and replacing the cell must drop it."""
    app = OneTable()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        fill(table)
        await pilot.pause()
        util = list(table.columns)[1]
        style = Style(bold=True)
        cache = compat.cell_render_cache(table)
        for row in (0, 1):
            table._render_cell(row, 1, style, 8)
        keys = {row: compat.cell_render_key(table, RowKey(row), util, style, False, False) for row in ("0", "1")}
        assert keys["0"] in cache and keys["1"] in cache
        compat.replace_cells(table, {"1": {util: Text("13%")}})
        assert keys["1"] not in cache and keys["0"] in cache  # the neighbour's rendering is kept


async def test_cell_styles_and_the_render_cell_override_point() -> None:
    app = OneTable()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        fill(table)
        await pilot.pause()
        component, over = compat.cell_styles(table, 0, 1, cursor=True, hover=False)
        assert isinstance(component, Style) and isinstance(over, Style)
    parameters = list(inspect.signature(DataTable._render_cell).parameters)  # FittedTable overrides it
    assert parameters == ["self", "row_index", "column_index", "base_style", "width", "cursor", "hover"]
