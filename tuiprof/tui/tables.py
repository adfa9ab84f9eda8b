"""Keeping a DataTable in step with fresh rows at the lowest redraw cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

Cell = Text | str


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


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
    fits = all(
        _width(cell) <= column.content_width
        for cells in rows.values() for cell, column in zip(cells, columns)
    )
    if keys == current and fits:
        for key in keys:
            for column, cell in zip(columns, rows[key]):
                if table.get_cell(key, column.key) != cell:
                    table.update_cell(key, column.key, cell)
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
