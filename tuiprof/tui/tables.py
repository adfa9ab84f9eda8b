"""Keeping a DataTable in step with fresh rows at the lowest redraw cost, and its columns
collapsing by priority to the terminal's width."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.color import Color
from textual.css.styles import RenderStyles
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import Column, ColumnKey

from tuiprof.tui.textual_compat import (
    cell_at, cell_keys, cell_render_cache, cell_render_key, cell_styles, replace_cells, row_label_width,
)

Cell = Text | str
T = TypeVar("T")
CELL_METAS = 2000
"""Cells whose coordinate style is kept: more than a screen of a table shows."""


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def _replace_cells(table: DataTable, changes: Mapping[str, Mapping[ColumnKey, Cell]]) -> None:
    """``update_cell`` for the changed cells of some rows, repainting only those rows
    and rendering anew only those cells.

    ``DataTable.update_cell`` repaints the whole table, header and empty space
    included, and a terminal receives all of it every second; repainting each cell
    apart is worse, since the terminal is sent the row's line up to every changed
    cell (bench/console/console_nvitop.md). It also bumps the table's update count, a part
    of the key of every one of its render caches, so each cell of each row shown is
    rendered again through Rich (the console's largest CPU cost,
    bench/console/console_cpu_profile.md); here only the changed cells' cache entries go.
    Writes the table's own cell store, as ``update_cell`` does.
    """
    replace_cells(table, changes)
    _repaint_rows(table, changes.keys())


def _repaint_rows(table: DataTable, keys: Collection[str]) -> None:
    """``refresh_row`` for the rows of ``keys``, in one pass: DataTable places each row it
    refreshes by adding up the heights of every row above it, and asks for each repaint apart."""
    width = max(table.size.width,
                sum(column.get_render_width(table) for column in table.columns.values())
                + row_label_width(table))
    window, scroll = table.window_region, table.scroll_offset
    y = table.header_height if table.show_header else 0
    regions = []
    for row in table.ordered_rows:
        region = Region(0, y, width, row.height)
        if row.key.value in keys and window.overlaps(region):
            regions.append(region.translate(-scroll))
        y += row.height
    if regions:
        table.refresh(*regions)


def sync_rows(table: DataTable, rows: Mapping[str, Sequence[Cell]]) -> None:
    """Show ``rows`` (key → cells, in order).

    Same keys in the same order and every cell fits its column: only changed
    cells are updated. Otherwise the table is rebuilt (the cursor stays on its
    row key), because a DataTable does not reliably re-lay out its rows when a
    column grows through ``update_cell``.
    """
    # Plain strings would be parsed as markup by the table: agent data is not markup.
    rows = {key: [Text(c) if isinstance(c, str) else c for c in cells] for key, cells in rows.items()}
    keys = list(rows)
    columns = list(table.columns.values())
    current = [row.key.value for row in table.ordered_rows]
    # not strict: a row may have fewer cells than the table has columns (the rest stay blank)
    fits = all(
        _width(cell) <= column.content_width
        for cells in rows.values() for cell, column in zip(cells, columns, strict=False)
    )
    if keys == current and fits:
        changes = {}
        for key in keys:
            changed = {column.key: cell for column, cell in zip(columns, rows[key], strict=False)
                       if table.get_cell(key, column.key) != cell}
            if changed:
                changes[key] = changed
        if changes:
            _replace_cells(table, changes)
        return
    selected = current[table.cursor_row] if current and 0 <= table.cursor_row < len(current) else None
    for index, column in enumerate(columns):
        # Size columns now: the table measures new rows only on idle, after it may
        # already have drawn (and cached) them at the old width.
        widest = max((_width(cells[index]) for cells in rows.values() if index < len(cells)), default=0)
        column.content_width = max(column.content_width, widest)
    table.clear()
    for key, cells in rows.items():
        table.add_row(*cells, key=key)
    if keys:
        table.move_cursor(row=keys.index(selected) if selected in rows else min(table.cursor_row, len(keys) - 1))


@dataclass(frozen=True, slots=True)
class TableColumn:
    """A column that may be dropped when the terminal is narrow: lowest ``priority`` first."""

    label: str
    priority: int
    """Higher stays longer; the first column of a table always stays."""


def fit_columns(priorities: Sequence[int], widths: Sequence[int], room: int, gap: int,
                hidden: Collection[int] = ()) -> list[int]:
    """Indices of the columns to show, in table order, so their ``widths`` plus a ``gap``
    each fit in ``room``: the first column always, then, highest priority first, each
    that still fits (a wide column left out does not keep a narrower, lower one out).

    Columns in ``hidden`` (chosen by the user) are never shown. When not even one more
    column fits next to the first, the highest-priority one is shown anyway (the table
    scrolls sideways then) rather than a table of names only.
    """
    used = widths[0] + gap if widths else 0
    candidates = sorted((i for i in range(1, len(widths)) if i not in hidden), key=lambda i: -priorities[i])
    shown = [0] if widths else []
    for index in candidates:
        if used + widths[index] + gap <= room or len(shown) == 1:
            shown.append(index)
            used += widths[index] + gap
    return sorted(shown)


class _StyleUntilRestyled(RenderStyles):
    """A component's styles whose Rich style is worked out once, until the table is restyled."""

    def __init__(self, styles: RenderStyles) -> None:
        node = styles.node
        assert node is not None  # a component's styles always belong to its virtual node
        super().__init__(node, styles.base, styles.inline)
        self._style = styles.rich_style

    @property
    def rich_style(self) -> Style:
        return self._style


class FittedTable(DataTable[Cell]):
    """A row-cursor DataTable whose columns collapse by priority to the width it has.

    It keeps every column's cells (``show_rows``) and shows those that fit, and
    not those the user hid (``hidden``: labels, from the column chooser).
    """

    _repaint_memo: dict[object, Any] | None = None
    """What ``_once_per_repaint`` made during the current ``render_lines`` (None outside one; a
    class attribute, since DataTable's constructor already asks for the columns)."""
    _style_memo: dict[object, Any] | None = None
    """What ``_once_until_restyled`` made since the table's styles last changed (None: nothing)."""

    def __init__(self, columns: Sequence[TableColumn], *, id: str, cursor: bool = True) -> None:
        super().__init__(id=id, cursor_type="row" if cursor else "none", zebra_stripes=True)
        self.all_columns = tuple(columns)
        self.hidden: frozenset[str] = frozenset()
        self._rows: dict[str, list[Text]] = {}
        self._shown: list[int] = []
        self.fixed_columns = 1
        self._cell_metas: LRUCache[tuple[int, int], Style] = LRUCache(CELL_METAS)

    @property
    def shown_labels(self) -> list[str]:
        return [self.all_columns[i].label for i in self._shown]

    def set_hidden(self, labels: Collection[str]) -> None:
        self.hidden = frozenset(labels)
        self._layout()

    def show_rows(self, rows: Mapping[str, Sequence[Cell]]) -> None:
        """Show ``rows`` (key → a cell per column of ``all_columns``), in order."""
        self._rows = {key: [Text(c) if isinstance(c, str) else c for c in cells] for key, cells in rows.items()}
        self._layout()

    def on_resize(self) -> None:
        self._layout()

    def _layout(self) -> None:
        widths = [max([cell_len(c.label), *(_width(cells[i]) for cells in self._rows.values() if i < len(cells))])
                  for i, c in enumerate(self.all_columns)]
        hidden = {i for i, c in enumerate(self.all_columns) if c.label in self.hidden}
        room = self.size.width - (self.scrollbar_size_vertical if self.show_vertical_scrollbar else 0)
        shown = fit_columns([c.priority for c in self.all_columns], widths, room or 10_000,
                            2 * self.cell_padding, hidden)
        if shown != self._shown:
            selected = self.cursor_key
            self._shown = shown
            self.clear(columns=True)
            self.add_columns(*(self.all_columns[i].label for i in shown))
            sync_rows(self, self._projected())
            if selected in self._rows:
                self.move_cursor(row=list(self._rows).index(selected))
            return
        sync_rows(self, self._projected())

    def render_lines(self, crop: Region) -> list[Strip]:
        """The lines of ``crop``, the columns and the size looked up once for all of them.

        DataTable lists its columns three times for each line it draws; no column and no size
        changes while one repaint draws its lines, so they are looked up once per repaint.
        """
        self._repaint_memo = {}
        try:
            return super().render_lines(crop)
        finally:
            self._repaint_memo = None

    def _once_per_repaint(self, name: object, make: Callable[[], T]) -> T:
        """``make()``, made once during a repaint (every time outside one)."""
        memo = self._repaint_memo
        if memo is None:
            return make()
        if name not in memo:
            memo[name] = make()
        return cast(T, memo[name])  # made by ``make`` under this name

    def notify_style_update(self) -> None:
        """Textual's word that this table's styles may have changed (CSS, theme, focus, hover,
        classes, here or above): every style it draws with is looked up again."""
        super().notify_style_update()
        self._style_memo = None

    def _once_until_restyled(self, name: object, make: Callable[[], T]) -> T:
        """``make()``, made once until the table is restyled.

        DataTable works out its own style, its background and the styles of the header, the
        fixed column and the row's stripe for every line it draws, and each lookup walks every
        ancestor's styles (``DOMNode.rich_style``): 15 % of the console's event loop while 8 GPU
        rows change (bench/console/console_cpu_profile.md, run 3); once per repaint they were still 14 %
        of it at one frame a second (run 8). They change only when Textual restyles the table,
        which is when DataTable drops its own rendered rows (``notify_style_update``).
        """
        memo = self._style_memo
        if memo is None:
            memo = self._style_memo = {}
        if name not in memo:
            memo[name] = make()
        return cast(T, memo[name])  # made by ``make`` under this name

    def get_component_styles(self, *names: str) -> RenderStyles:
        return self._once_until_restyled(
            names, lambda: _StyleUntilRestyled(super(FittedTable, self).get_component_styles(*names)))

    @property
    def rich_style(self) -> Style:
        return self._once_until_restyled("rich_style", lambda: super(FittedTable, self).rich_style)

    @property
    def background_colors(self) -> tuple[Color, Color]:
        return self._once_until_restyled("background_colors", lambda: super(FittedTable, self).background_colors)

    @property
    def ordered_columns(self) -> list[Column]:
        """DataTable makes this list three times for each line it draws."""
        return self._once_per_repaint("ordered_columns", lambda: super(FittedTable, self).ordered_columns)

    @property
    def size(self) -> Size:
        return self._once_per_repaint("size", lambda: super(FittedTable, self).size)

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> list[list[Segment]]:
        """A body cell of one line that fits its column, rendered without Rich's layout machinery.

        DataTable renders each cell through ``Console.render_lines(Styled(Padding(cell)))``,
        ~140 µs a cell on the development VM and most of the console's CPU while rows change
        (bench/console/console_cpu_profile.md). Every cell here is one line of ``Text`` no wider than
        its column (``sync_rows`` sizes the columns), so the same segments are made directly:
        padding, the text's own segments, padding to the width, each under the table's style
        and over the cursor's (as ``Styled`` layers them), kept in the table's own cell cache.
        Header cells, and any cell that does not fit, go through DataTable's own rendering.
        """
        row_key, column_key = cell_keys(self, row_index, column_index)  # None: the header row, the row labels
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        cache_key = cell_render_key(self, row_key, column_key, base_style, cursor, hover)
        cache = cell_render_cache(self)
        cached = cache.get(cache_key)
        if cached is not None:
            return cached
        cell = cell_at(self, row_key, column_key)
        room = width - 2 * self.cell_padding
        if not isinstance(cell, Text) or "\n" in cell.plain or "\t" in cell.plain or cell.cell_len > room:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        component_style, post_style = cell_styles(self, row_index, column_index, cursor, hover)
        pre_style = base_style + self._cell_meta(row_index, column_index) + component_style
        console = self.app.console
        text = cell.render(console, end="")  # the spans' styles; the text's own goes under them
        if cell.style:
            text = Segment.apply_style(text, console.get_style(cell.style))
        padding = " " * self.cell_padding
        segments = [Segment(padding), *text, Segment(" " * (room - cell.cell_len) + padding)]
        # Neighbours of one style as one segment (most cells: padding, text and fill alike): every
        # line drawn from the cache then has a third of the segments to join, crop and compare.
        line = list(Segment.simplify(Segment.apply_style([s for s in segments if s.text], pre_style, post_style)))
        cache[cache_key] = [line]
        return [line]

    def _cell_meta(self, row_index: int, column_index: int) -> Style:
        """The style carrying a cell's coordinates (for the mouse), made once per cell: Rich
        serializes the meta each time it makes one (``Style.from_meta``)."""
        meta = self._cell_metas.get((row_index, column_index))
        if meta is None:
            meta = self._cell_metas[row_index, column_index] = Style.from_meta({"row": row_index, "column": column_index})
        return meta

    def _projected(self) -> dict[str, list[Cell]]:
        return {key: [cells[i] for i in self._shown if i < len(cells)] for key, cells in self._rows.items()}

    @property
    def cursor_key(self) -> str | None:
        rows = self.ordered_rows
        return rows[self.cursor_row].key.value if rows and 0 <= self.cursor_row < len(rows) else None
