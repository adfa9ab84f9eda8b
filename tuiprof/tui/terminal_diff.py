"""Send the terminal only the cells that changed.

Textual repaints a widget's region line by line: one changed number in a table row
sends the whole row, its padding and a colour code per cell, every second. curses
programs such as nvitop send only the changed cells, ~30x fewer bytes, which matters
over a slow ssh link (bench/console_nvitop.md). ``ScreenDiff`` sits between Textual
and the terminal: it keeps what each cell of the screen shows (character and style,
as Textual's own escape sequences set them), and of what Textual writes it passes on
only the cells that differ, with the cursor moves and styles they need. Everything
that is not drawing (modes, synchronized-update markers, the final cursor position)
passes through in order. Anything it cannot follow (an erase, a sequence it does not
know, a new terminal size) makes it forget the screen, so the next frame goes out whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from rich.cells import get_character_cell_size
from textual.app import App

# Escape sequences as Textual writes them: CSI (cursor moves, styles, modes), charset
# selection, OSC (title, clipboard), and any other two-byte escape.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[()][0-9A-Za-z]|\][^\x07\x1b]*(?:\x07|\x1b\\)|.)", re.S)
_RESET = "\x1b[0m"
# Unchanged cells between two changed ones that are sent again rather than moving the cursor
# past them: a move and a style cost ~20-40 bytes.
_BRIDGE_CELLS = 6

Cell = tuple[str, str]  # (character, style: the SGR sequences in force), "" for the right half of a wide one


class ScreenDiff:
    """Filters Textual's output to the cells that changed (see the module's docstring)."""

    def __init__(self, size: Callable[[], tuple[int, int]]) -> None:
        self._size = size
        self._known_size: tuple[int, int] | None = None
        self._screen: dict[tuple[int, int], Cell] = {}  # what the terminal shows, where known
        # The terminal's cursor and style as Textual's output left them: they carry over
        # from one write to the next, as on the terminal.
        self._x = self._y = 0
        self._style = ""

    def forget(self) -> None:
        """The terminal's content is unknown: the next frame is sent whole."""
        self._screen.clear()

    def filter(self, data: str) -> str:
        size = self._size()
        if size != self._known_size:
            self._known_size = size
            self.forget()
        out: list[str] = []
        changed: dict[tuple[int, int], Cell] = {}
        x, y, style = self._x, self._y, self._style
        pending_move = ""  # a cursor move not (yet) followed by text: where Textual leaves the cursor
        position = 0
        for match in _ESCAPE.finditer(data):
            if match.start() > position:
                x, y = self._draw(data[position:match.start()], x, y, style, changed)
                pending_move = ""
            sequence = match.group()
            position = match.end()
            final = sequence[-1]
            if sequence.startswith("\x1b[") and final == "H" and "?" not in sequence:
                row, _, column = sequence[2:-1].partition(";")
                y, x = int(row or 1) - 1, int(column or 1) - 1
                pending_move = sequence
            elif sequence.startswith("\x1b[") and final == "m":
                params = sequence[2:-1]
                style = "" if params in ("", "0") else style + sequence
            else:
                if sequence.startswith("\x1b[") and final in "JKLMPX@STr":  # erases, scrolls: lost track
                    self.forget()
                out.extend(self._runs(changed))
                changed.clear()
                out.append(pending_move)
                pending_move = ""
                out.append(sequence)
                if sequence in ("\x1b[?1049h", "\x1b[?1049l"):  # another screen buffer
                    self.forget()
        if position < len(data):
            x, y = self._draw(data[position:], x, y, style, changed)
            pending_move = f"\x1b[{y + 1};{x + 1}H"  # where Textual's text left the cursor, not the runs
        out.extend(self._runs(changed))
        out.append(pending_move)
        self._x, self._y, self._style = x, y, style
        return "".join(out)

    def _draw(self, text: str, x: int, y: int, style: str,
              changed: dict[tuple[int, int], Cell]) -> tuple[int, int]:
        """Put ``text`` at (x, y); cells whose content differs from the screen go into ``changed``."""
        screen = self._screen
        if text.isascii() and "\r" not in text and "\n" not in text:  # most of what Textual writes
            for offset, char in enumerate(text):
                where, cell = (x + offset, y), (char, style)
                if screen.get(where) != cell:
                    changed[where] = cell
                    screen[where] = cell
            return x + len(text), y
        for char in text:
            if char == "\r":
                x = 0
                continue
            if char == "\n":
                y += 1
                continue
            width = 1 if char.isascii() else get_character_cell_size(char)
            if width == 0:  # a combining mark: part of the previous cell, so redraw that cell whole
                screen.pop((x - 1, y), None)
                continue
            cells = [(char, style)] + [("", style)] * (width - 1)
            for offset, cell in enumerate(cells):
                where = (x + offset, y)
                if screen.get(where) != cell:
                    changed[where] = cell
                    screen[where] = cell
            x += width
        return x, y

    def _runs(self, changed: dict[tuple[int, int], Cell]) -> Iterator[str]:
        """The escape sequences that draw ``changed``: per line, runs of nearby changed cells."""
        if not changed:
            return
        screen = self._screen
        for y, xs in _by_line(changed):
            start = previous = xs[0]
            for x in xs[1:] + [None]:
                # Bridge a short gap by sending its cells again, when the screen knows them.
                if x is not None and x - previous <= _BRIDGE_CELLS and all(
                        (gap, y) in screen for gap in range(previous + 1, x)):
                    previous = x
                    continue
                yield self._run(y, start, previous, screen)
                if x is not None:
                    start = previous = x

    @staticmethod
    def _run(y: int, first: int, last: int, screen: dict[tuple[int, int], Cell]) -> str:
        while first > 0 and screen.get((first, y), (" ", ""))[0] == "":  # never start in a wide character's half
            first -= 1
        parts = [f"\x1b[{y + 1};{first + 1}H"]
        style: str | None = None
        for x in range(first, last + 1):
            char, cell_style = screen.get((x, y), (" ", ""))
            if char == "":
                continue
            if cell_style != style:
                parts.append(_RESET + cell_style)
                style = cell_style
            parts.append(char)
        parts.append(_RESET)
        return "".join(parts)


def _by_line(changed: dict[tuple[int, int], Cell]) -> Iterator[tuple[int, list[int]]]:
    lines: dict[int, list[int]] = {}
    for x, y in changed:
        lines.setdefault(y, []).append(x)
    for y in sorted(lines):
        yield y, sorted(lines[y])


def send_only_changes(app: App) -> None:
    """Put a ``ScreenDiff`` between ``app`` and its terminal (not in headless or inline runs)."""
    driver = app._driver
    if driver is None or app.is_headless or driver.is_inline:
        return
    diff = ScreenDiff(lambda: (app.size.width, app.size.height))  # the terminal's size, as Textual last read it
    write = driver.write

    def write_changes(data: str) -> None:
        write(diff.filter(data))

    driver.write = write_changes  # type: ignore[method-assign]
