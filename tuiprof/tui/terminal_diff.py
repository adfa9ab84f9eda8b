"""Send the terminal only the cells that changed.

Textual repaints a widget's region line by line: one changed number in a table row
sends the whole row, its padding and a colour code per cell, every second. curses
programs such as nvitop send only the changed cells, ~30x fewer bytes, which matters
over a slow ssh link (bench/console/console_nvitop.md). ``ScreenDiff`` sits between Textual
and the terminal: it keeps what each cell of the screen shows (character and style,
as Textual's own escape sequences set them), and of what Textual writes it passes on
only the cells that differ, with the cursor moves and styles they need. Everything
that is not drawing (modes, synchronized-update markers, the final cursor position)
passes through in order. Anything it cannot follow (an erase, a sequence it does not
know, a new terminal size) makes it forget the screen, so the next frame goes out whole.
An OSC other than a hyperlink (a clipboard write, a window title) is never passed on:
Textual draws none, so one can only come from text another user wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from rich.cells import get_character_cell_size
from textual.app import App

from tuiprof.tui.textual_compat import app_driver, replace_driver_write

# Escape sequences as Textual writes them: CSI (cursor moves, styles, modes), charset
# selection, OSC (title, clipboard), and any other two-byte escape.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[()][0-9A-Za-z]|\][^\x07\x1b]*(?:\x07|\x1b\\)|.)", re.S)
_RESET = "\x1b[0m"
SYNC_START, SYNC_END = "\x1b[?2026h", "\x1b[?2026l"  # a synchronized update (mode 2026): Textual's frame
# Unchanged cells between two changed ones that are sent again rather than moving the cursor
# past them: a move and a style cost ~20-40 bytes.
_BRIDGE_CELLS = 6

Changed = dict[int, list[int]]
"""The cells a write changed: line → columns (in the order written, possibly repeated)."""


class ScreenDiff:
    """Filters Textual's output to the cells that changed (see the module's docstring)."""

    def __init__(self, size: Callable[[], tuple[int, int]]) -> None:
        self._size = size
        self._known_size: tuple[int, int] | None = None
        # What the terminal shows, per line: each cell's character ("" for the right half of a wide
        # one, None where unknown) and style (the SGR sequences in force). Per line, so that a run
        # of text is compared with what the screen shows as two list slices, not cell by cell.
        self._chars: dict[int, list[str | None]] = {}
        self._styles: dict[int, list[str]] = {}
        # The terminal's cursor and style as Textual's output left them: they carry over
        # from one write to the next, as on the terminal.
        self._x = self._y = 0
        self._style = ""

    def forget(self) -> None:
        """The terminal's content is unknown: the next frame is sent whole."""
        self._chars.clear()
        self._styles.clear()

    def filter(self, data: str) -> str:
        size = self._size()
        if size != self._known_size:
            self._known_size = size
            self.forget()
        out: list[str] = []
        changed: Changed = {}
        x, y, style = self._x, self._y, self._style
        pending_move = ""  # a cursor move not (yet) followed by text: where Textual leaves the cursor
        position = 0
        for match in _ESCAPE.finditer(data):
            if match.start() > position:
                x, y = self._draw(data[position:match.start()], x, y, style, changed)
                pending_move = ""
            sequence = match.group()
            position = match.end()
            final, csi = sequence[-1], sequence[1] == "["
            if csi and final == "m":  # a style: the most frequent sequence by far
                style = "" if sequence in ("\x1b[m", "\x1b[0m") else style + sequence
            elif csi and final == "H" and "?" not in sequence:
                row, _, column = sequence[2:-1].partition(";")
                y, x = max(int(row or 1), 1) - 1, max(int(column or 1), 1) - 1  # 0 means 1, as on a terminal
                pending_move = sequence
            else:
                out.extend(self._runs(changed))  # what was drawn before it, while the screen is still known
                changed.clear()
                out.append(pending_move)
                pending_move = ""
                if sequence.startswith("\x1b]") and not sequence.startswith("\x1b]8;"):
                    continue  # an OSC that is not a hyperlink (a clipboard write, a title): never Textual's drawing
                out.append(sequence)
                if (csi and final in "JKLMPX@STr") or sequence in ("\x1b[?1049h", "\x1b[?1049l"):
                    self.forget()  # erases, scrolls, another screen buffer: lost track
        if position < len(data):
            x, y = self._draw(data[position:], x, y, style, changed)
            pending_move = f"\x1b[{y + 1};{x + 1}H"  # where Textual's text left the cursor, not the runs
        out.extend(self._runs(changed))
        out.append(pending_move)
        self._x, self._y, self._style = x, y, style
        return "".join(out)

    def _line(self, y: int, end: int) -> tuple[list[str | None], list[str]]:
        """Line ``y``'s characters and styles, known or not up to column ``end``."""
        chars = self._chars.get(y)
        if chars is None:
            chars, styles = self._chars[y], self._styles[y] = [], []
        else:
            styles = self._styles[y]
        if len(chars) < end:
            chars.extend([None] * (end - len(chars)))
            styles.extend([""] * (end - len(styles)))
        return chars, styles

    def _draw(self, text: str, x: int, y: int, style: str, changed: Changed) -> tuple[int, int]:
        """Put ``text`` at (x, y); cells whose content differs from the screen go into ``changed``."""
        if text.isascii() and "\r" not in text and "\n" not in text:  # most of what Textual writes
            end = x + len(text)
            chars, styles = self._line(y, end)
            new = list(text)
            if chars[x:end] != new or styles[x:end] != [style] * len(new):  # else: shown as it is
                columns = changed.setdefault(y, [])
                for column, char in enumerate(new, x):
                    if chars[column] != char or styles[column] != style:
                        chars[column], styles[column] = char, style
                        columns.append(column)
            return end, y
        for char in text:
            if char == "\r":
                x = 0
                continue
            if char == "\n":
                y += 1
                continue
            width = 1 if char.isascii() else get_character_cell_size(char)
            if width == 0:  # a combining mark: part of the previous cell, so redraw that cell whole
                if x > 0:
                    self._line(y, x)[0][x - 1] = None
                continue
            chars, styles = self._line(y, x + width)
            for column, cell_char in enumerate([char] + [""] * (width - 1), x):
                if chars[column] != cell_char or styles[column] != style:
                    chars[column], styles[column] = cell_char, style
                    changed.setdefault(y, []).append(column)
            x += width
        return x, y

    def _runs(self, changed: Changed) -> Iterator[str]:
        """The escape sequences that draw ``changed``: per line, runs of nearby changed cells."""
        for y in sorted(changed):
            chars = self._chars[y]
            xs = sorted(set(changed[y]))
            start = previous = xs[0]
            for x in xs[1:] + [None]:
                # Bridge a short gap by sending its cells again, when the screen knows them.
                if x is not None and x - previous <= _BRIDGE_CELLS and all(
                        chars[gap] is not None for gap in range(previous + 1, x)):
                    previous = x
                    continue
                yield self._run(y, start, previous)
                if x is not None:
                    start = previous = x

    def _run(self, y: int, first: int, last: int) -> str:
        chars, styles = self._chars[y], self._styles[y]
        while first > 0 and chars[first] == "":  # never start in a wide character's half
            first -= 1
        parts = [f"\x1b[{y + 1};{first + 1}H"]
        style: str | None = None
        for x in range(first, last + 1):
            char, cell_style = chars[x], styles[x]
            if char is None:  # unknown (a combining mark's cell): a blank
                char, cell_style = " ", ""
            if char == "":
                continue
            if cell_style != style:
                parts.append(_RESET + cell_style)
                style = cell_style
            parts.append(char)
        parts.append(_RESET)
        return "".join(parts)


def send_only_changes(app: App) -> None:
    """Put a ``ScreenDiff`` between ``app`` and its terminal (not in headless or inline runs).

    Textual writes a frame in three parts (begin synchronized update, the frame, end it), each
    handed to its output thread and written on its own; here a frame goes out as one write: one
    hand-off and one system call a frame instead of three.
    """
    driver = app_driver(app)
    if driver is None or app.is_headless or driver.is_inline:
        return
    diff = ScreenDiff(lambda: (app.size.width, app.size.height))  # the terminal's size, as Textual last read it
    write = driver.write
    frame: list[str] = []  # a frame begun and not yet ended

    def write_changes(data: str) -> None:
        if data == SYNC_START:
            frame.append(data)
            return
        changes = diff.filter(data)
        if not frame:
            write(changes)
            return
        frame.append(changes)
        if data.endswith(SYNC_END):
            write("".join(frame))
            frame.clear()

    replace_driver_write(driver, write_changes)
