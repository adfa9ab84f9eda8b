"""Every use of Textual's private internals, in one place, each behind a small named function.

The console's speed comes partly from reaching inside Textual (bench/console/console_cpu_profile.md):
DataTable's cell store and render caches (``tables.py``: only changed cells are rendered again,
cells rendered without Rich's layout), the app's driver (``terminal_diff.py``: only changed cells are
sent) and the input parser (``driver.py``: an input thread that sleeps). None of these is Textual's
public API, so a Textual upgrade may move them: ``tests/console/test_textual_compat.py`` calls every
function here against real Textual objects and fails, by name, on the one that moved. Written for
Textual 8.2.

``tables.FittedTable`` also overrides ``DataTable._render_cell`` (its signature is checked by the same
test), and ``driver._InputWaitingDriver`` replaces ``LinuxDriver.run_input_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual.app import App
from textual.cache import LRUCache
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.widgets import DataTable
from textual.widget import PseudoClasses
from textual.widgets.data_table import CellType, ColumnKey, RowKey

try:  # Textual's own input parser and clock: private modules
    from textual._time import get_time as textual_clock
    from textual._xterm_parser import XTermParser
except ImportError:  # pragma: no cover - only with a Textual this was not written for
    XTermParser = None  # type: ignore[assignment,misc]  # driver.py then keeps Textual's own driver

__all__ = [
    "XTermParser", "app_driver", "cell_at", "cell_keys", "cell_render_cache", "cell_render_key", "cell_styles",
    "escape_due", "input_parser_as_expected", "key_parser", "key_thread_running", "replace_cells",
    "replace_driver_write", "row_label_width", "textual_clock",
]

CellLines = list[list[Segment]]
"""A rendered cell: its lines, each a list of segments (what DataTable caches per cell)."""
CellRenderKey = tuple[RowKey, ColumnKey, Style, bool, bool, bool, int, PseudoClasses]
"""What DataTable files a rendered cell under: the cell, the styles around it, the table's version."""


# ---------------------------------------------------------------- the app and its driver

def app_driver(app: App[Any]) -> Driver | None:
    """The driver writing ``app``'s frames to the terminal (None before it runs)."""
    return app._driver


def key_thread_running(driver: LinuxDriver) -> bool:
    """Whether ``driver``'s input thread has started and not yet ended."""
    thread = driver._key_thread
    return thread is not None and thread.is_alive()


def key_parser(driver: LinuxDriver) -> XTermParser:
    """A new parser of the terminal's input, as ``driver``'s own input thread makes it."""
    return XTermParser(driver._debug)


def escape_due(parser: XTermParser) -> float | None:
    """When (``textual_clock()`` time) a lone Esc the parser holds becomes the Escape key; None: none held."""
    due: float | None = parser._timeout_time
    return due


def input_parser_as_expected() -> bool:
    """Whether the installed Textual's parser has what ``driver._InputWaitingDriver`` relies on."""
    return XTermParser is not None and hasattr(XTermParser, "tick") and "_timeout_time" in vars(XTermParser(False))


# ---------------------------------------------------------------- DataTable's cells and caches

def row_label_width(table: DataTable[Any]) -> int:
    """The width of the table's row-label column (0 without labels)."""
    return table._row_label_column_width


def replace_cells(table: DataTable[Any], changes: Mapping[str, Mapping[ColumnKey, CellType]]) -> None:
    """Write ``changes`` (row key → column → new cell) into the table's cell store, as ``update_cell``
    does, and drop the rendered forms of those cells and rows only (``update_cell`` drops every one)."""
    stale_cells: set[tuple[str, int]] = set()
    for key, changed in changes.items():
        table._data[RowKey(key)].update(changed)
        stale_cells.update((key, id(column_key)) for column_key in changed)
    # Cell cache key: (row key, column key, styles...); row cache key: (row key, line, styles...).
    # Compared by the row's string and the column key's identity (the table's own key objects, which
    # may carry no string): hashing the keys themselves runs Python code for each entry.
    cell_cache, row_cache = table._cell_render_cache, table._row_render_cache
    for cell_key in [k for k in cell_cache.keys() if (k[0].value, id(k[1])) in stale_cells]:  # noqa: SIM118 (an LRUCache: not iterable)
        cell_cache.discard(cell_key)
    for row_cache_key in [k for k in row_cache.keys() if k[0].value in changes]:  # noqa: SIM118 (likewise)
        row_cache.discard(row_cache_key)
    table._row_renderable_cache.clear()  # the cells of each row, formatted: cheap to make again
    table._line_cache.clear()  # lines joined from the row cache: cheap to make again


def cell_keys(table: DataTable[Any], row_index: int, column_index: int) -> tuple[RowKey | None, ColumnKey | None]:
    """The row and column keys at a place of the table (None: the header row, the row labels)."""
    return table._row_locations.get_key(row_index), table._column_locations.get_key(column_index)


def cell_at(table: DataTable[Any], row_key: RowKey, column_key: ColumnKey) -> object:
    """The cell stored under these keys, as it was added (before any rendering)."""
    cell: object = table._data[row_key][column_key]
    return cell


def cell_render_key(table: DataTable[Any], row_key: RowKey, column_key: ColumnKey, base_style: Style,
                    cursor: bool, hover: bool) -> CellRenderKey:
    """The key DataTable files a rendered cell under in its cell cache (``DataTable._render_cell``)."""
    return (row_key, column_key, base_style, cursor, hover, table._show_hover_cursor, table._update_count,
            table._pseudo_class_state)


def cell_render_cache(table: DataTable[Any]) -> LRUCache[CellRenderKey, CellLines]:
    """DataTable's cache of rendered cells (keys from ``cell_render_key``)."""
    return table._cell_render_cache


def cell_styles(table: DataTable[Any], row_index: int, column_index: int, cursor: bool,
                hover: bool) -> tuple[Style, Style]:
    """The component style a body cell is drawn with, and the style drawn over it (the cursor's, the
    hover's), as DataTable works them out."""
    fixed = row_index < table.fixed_rows or column_index < table.fixed_columns
    styles: tuple[Style, Style] = table._get_styles_to_render_cell(
        False, False, fixed, hover, cursor, table.show_cursor, table._show_hover_cursor,
        table.cursor_foreground_priority == "css", table.cursor_background_priority == "css")
    return styles


def replace_driver_write(driver: Driver, write: Callable[[str], None]) -> None:
    """Every write of ``driver`` (its output thread's hand-off) goes through ``write`` from now on: an
    attribute of this driver object that shadows the class's method (Textual calls ``self.write``)."""
    vars(driver)["write"] = write
