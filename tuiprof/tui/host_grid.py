"""A table for thousands of rows that change every second: the cluster view's host list.

Textual's DataTable re-renders every visible cell whenever any cell changes; with
a whole fleet updating each second that repaint dominates the console's cost.
This grid is written against the Line API instead: each row is rendered to a
cached strip only when its cells change (rows hand over their cells as a list
whose identity changes with its content), only on-screen rows are ever rendered,
and a repaint just crops and styles cached strips. Columns have fixed widths
(wider text is cut with an ellipsis), so one row changing never re-lays out the
others. Columns that do not fit the width collapse by priority (lowest first,
``tables.fit_columns``), and columns the user hid are not drawn; the first column
stays in place when scrolling sideways (only when even two columns do not fit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tuiprof.tui.tables import fit_columns

Cell = Text | str
GAP = 2
"""Spaces between columns."""
MARGIN = 1
"""Spaces before the first column."""


@dataclass(frozen=True, slots=True)
class GridColumn:
    key: str
    label: str
    width: int
    priority: int
    """Higher stays longer when the grid is narrow; the first column always stays."""


class HostGrid(ScrollView, can_focus=True):
    """Rows keyed by string, drawn lazily from a mapping key → cells."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(False)", "First", show=False),
        Binding("end", "edge(True)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    COMPONENT_CLASSES = {"host-grid--header", "host-grid--cursor", "host-grid--odd"}

    DEFAULT_CSS = """
    HostGrid { background: $surface; }
    HostGrid > .host-grid--header { background: $panel; color: $text; text-style: bold; }
    HostGrid > .host-grid--cursor { background: $block-cursor-background; color: $block-cursor-foreground; }
    HostGrid:blur > .host-grid--cursor { background: $block-cursor-blurred-background; }
    HostGrid > .host-grid--odd { background: $surface-lighten-1; }
    """

    class RowHighlighted(Message):
        """The cursor moved to the row ``key``."""

        def __init__(self, grid: HostGrid, key: str) -> None:
            super().__init__()
            self.grid, self.key = grid, key

    class RowSelected(Message):
        """Enter was pressed on the row ``key``."""

        def __init__(self, grid: HostGrid, key: str) -> None:
            super().__init__()
            self.grid, self.key = grid, key

    class HeaderSelected(Message):
        """The header of column ``column`` was clicked."""

        def __init__(self, grid: HostGrid, column: str) -> None:
            super().__init__()
            self.grid, self.column = grid, column

    def __init__(self, columns: Sequence[GridColumn], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = tuple(columns)
        self._rows: Mapping[str, Sequence[Cell]] = {}
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._strips: dict[str, tuple[Sequence[Cell], Strip, Strip]] = {}
        self.cursor = 0
        self._sorted: tuple[str, bool] | None = None  # column key, descending
        self.hidden: frozenset[str] = frozenset()
        """Keys of the columns the user hid."""
        self._shown: list[int] = list(range(len(self.columns)))
        self._first_width = MARGIN + self.columns[0].width + GAP
        self._rest_width = sum(c.width + GAP for c in self.columns[1:])

    # ---------------------------------------------------------------- data

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor] if self._keys else None

    def shows(self, key: str) -> bool:
        """Whether row ``key`` is on screen now (a change to any other row can wait)."""
        index = self._index.get(key)
        top = int(self.scroll_offset.y)
        return index is not None and top <= index < top + self.size.height - 1

    def cell(self, key: str, column: str) -> Cell:
        index = next(i for i, c in enumerate(self.columns) if c.key == column)
        return self._rows[key][index]

    @property
    def shown_columns(self) -> list[GridColumn]:
        """The columns drawn now (those that fit and are not hidden), in order."""
        return [self.columns[i] for i in self._shown]

    def set_first_width(self, width: int) -> None:
        """Resize the first (fixed) column, e.g. to the longest host name."""
        if width != self.columns[0].width:
            first = self.columns[0]
            self.columns = (GridColumn(first.key, first.label, width, first.priority), *self.columns[1:])
            self._fit()

    def set_hidden(self, keys: frozenset[str]) -> None:
        """Hide the columns ``keys`` (the column chooser's choice)."""
        self.hidden = keys
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Choose the columns that fit the width, and re-render the rows with them."""
        hidden = {i for i, c in enumerate(self.columns) if c.key in self.hidden}
        room = self.size.width or 10_000  # not laid out yet: all, until the first resize
        self._shown = fit_columns([c.priority for c in self.columns], [c.width for c in self.columns],
                                  room - MARGIN, GAP, hidden)
        shown = self.shown_columns
        self._first_width = MARGIN + shown[0].width + GAP
        self._rest_width = sum(c.width + GAP for c in shown[1:])
        self._strips.clear()
        self.virtual_size = Size(self._first_width + self._rest_width, len(self._keys) + 1)
        self.refresh()

    def mark_sorted(self, column: str, descending: bool) -> None:
        """Mark ``column``'s header as the sort key (underlined, with its direction where it fits)."""
        if self._sorted != (column, descending):
            self._sorted = (column, descending)
            self.refresh_line(0)

    def _header_label(self, column: GridColumn) -> Text:
        if self._sorted is None or self._sorted[0] != column.key:
            return Text(column.label)
        arrow = "↓" if self._sorted[1] else "↑"
        label = f"{column.label}{arrow}" if len(column.label) < column.width else column.label
        return Text(label, style="underline")

    def set_rows(self, rows: Mapping[str, Sequence[Cell]]) -> None:
        """Show ``rows`` in their order; the cursor stays on its key when it is still there."""
        selected = self.cursor_key
        keys = list(rows)
        self._rows = rows
        if keys == self._keys:
            self._refresh_changed_rows()
            return
        self._keys = keys
        self._index = {key: i for i, key in enumerate(keys)}
        self._strips = {k: v for k, v in self._strips.items() if k in self._index}
        self.virtual_size = Size(self._first_width + self._rest_width, len(keys) + 1)
        if selected in self._index:
            self.cursor = self._index[selected]
        self.cursor = max(0, min(self.cursor, len(keys) - 1))
        self.refresh()

    def _refresh_changed_rows(self) -> None:
        """Same rows in the same order: repaint only the on-screen rows whose cells changed
        (with a fleet updating every second, a few rows a frame instead of a screenful)."""
        top = int(self.scroll_offset.y)
        for index in range(top, min(len(self._keys), top + self.size.height - 1)):
            key = self._keys[index]
            cached = self._strips.get(key)
            if cached is None or cached[0] is not self._rows[key]:
                self.refresh_line(index + 1)  # virtual line 0 is the header

    # ---------------------------------------------------------------- rendering

    def _render_cells(self, cells: Sequence[Cell], columns: Sequence[GridColumn], margin: int = 0) -> Strip:
        line = Text(" " * margin)
        for cell, column in zip(cells, columns, strict=True):
            text = cell.copy() if isinstance(cell, Text) else Text(cell)
            text.truncate(column.width, overflow="ellipsis", pad=True)
            line.append_text(text)
            line.append(" " * GAP)
        return Strip(line.render(self.app.console))

    def _row_strips(self, key: str) -> tuple[Strip, Strip]:
        cells = self._rows[key]
        cached = self._strips.get(key)
        if cached is not None and cached[0] is cells:
            return cached[1], cached[2]
        shown = self.shown_columns
        first = self._render_cells(cells[:1], shown[:1], MARGIN)
        rest = self._render_cells([cells[i] for i in self._shown[1:]], shown[1:])
        self._strips[key] = (cells, first, rest)
        return first, rest

    def _line(self, first: Strip, rest: Strip, style: Style) -> Strip:
        scroll_x = int(self.scroll_offset.x)
        width = self.size.width
        line = Strip.join([first, rest.crop(scroll_x, scroll_x + max(0, width - first.cell_length))])
        return line.apply_style(style).crop(0, width).extend_cell_length(width, style)

    def render_line(self, y: int) -> Strip:
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("host-grid--header")
            shown = self.shown_columns
            labels = [self._header_label(c) for c in shown]
            first = self._render_cells(labels[:1], shown[:1], MARGIN)
            rest = self._render_cells(labels[1:], shown[1:])
            return self._line(first, rest, base + header)
        index = int(self.scroll_offset.y) + y - 1
        if index >= len(self._keys):
            return Strip.blank(self.size.width, base)
        first, rest = self._row_strips(self._keys[index])
        if index == self.cursor:
            style = base + self.get_component_rich_style("host-grid--cursor")
        elif index % 2:
            style = base + self.get_component_rich_style("host-grid--odd")
        else:
            style = base
        return self._line(first, rest, style)

    # ---------------------------------------------------------------- cursor

    def move_cursor(self, index: int) -> None:
        if not self._keys:
            return
        index = max(0, min(index, len(self._keys) - 1))
        changed = index != self.cursor
        self.cursor = index
        visible = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if index < top:
            self.scroll_to(y=index, animate=False)
        elif index >= top + visible:
            self.scroll_to(y=index - visible + 1, animate=False)
        self.refresh()
        if changed:
            self.post_message(self.RowHighlighted(self, self._keys[index]))

    def action_cursor(self, step: int) -> None:
        self.move_cursor(self.cursor + step)

    def action_page(self, step: int) -> None:
        self.move_cursor(self.cursor + step * max(1, self.size.height - 2))

    def action_edge(self, last: bool) -> None:
        self.move_cursor(len(self._keys) - 1 if last else 0)

    def action_select(self) -> None:
        if self._keys:
            self.post_message(self.RowSelected(self, self._keys[self.cursor]))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = event.x if event.x < self._first_width else event.x + int(self.scroll_offset.x)
            edge = MARGIN
            for column in self.shown_columns:
                edge += column.width + GAP
                if x < edge:
                    self.post_message(self.HeaderSelected(self, column.key))
                    return
            return
        self.move_cursor(int(self.scroll_offset.y) + event.y - 1)
