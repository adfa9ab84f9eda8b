"""The column chooser (`C`): the current table's columns with checkboxes; the choice is a setting.

Hidden columns are saved as ``table.column`` keys (``Settings.hidden_columns``),
so each table takes back its own when the console starts again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, SelectionList


def hidden_in(table: str, saved: Iterable[str]) -> set[str]:
    """The labels of ``table``'s columns among the saved ``table.column`` keys."""
    prefix = f"{table}."
    return {key.removeprefix(prefix) for key in saved if key.startswith(prefix)}


def with_hidden(table: str, saved: Iterable[str], labels: Collection[str]) -> tuple[str, ...]:
    """The saved keys with ``table``'s replaced by ``labels`` (sorted, so a file diff stays small)."""
    others = [key for key in saved if not key.startswith(f"{table}.")]
    return tuple(sorted([*others, *(f"{table}.{label}" for label in labels)]))


class ColumnsScreen(ModalScreen[frozenset[str]]):
    """Tick the columns to show (space or Enter); Esc closes and returns the labels left unticked.

    The first column names the row and cannot be hidden, so it is not listed.
    """

    BINDINGS = [
        Binding("escape", "done", "Done"),
        Binding("C", "done", "Done", show=False),
    ]
    DEFAULT_CSS = """
    ColumnsScreen { align: center middle; }
    ColumnsScreen > Vertical {
        width: 44; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    ColumnsScreen SelectionList { height: auto; max-height: 20; }
    """

    def __init__(self, title: str, labels: Sequence[str], hidden: Collection[str]) -> None:
        super().__init__()
        self.title_text = title
        self.labels = list(labels[1:])
        self.hidden = set(hidden)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Columns of {self.title_text}\nspace shows/hides · Esc closes", markup=False)
            yield SelectionList[str](*((label, label, label not in self.hidden) for label in self.labels))

    def action_done(self) -> None:
        shown = set(self.query_one(SelectionList).selected)
        self.dismiss(frozenset(label for label in self.labels if label not in shown))
