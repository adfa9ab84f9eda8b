"""ScreenDiff: the terminal gets only the cells that changed, and shows the same screen.

The end-to-end test runs a real Textual app in a pseudo-terminal (no ScreenDiff in it),
filters what it wrote, and has a real terminal emulator (tmux) show both streams."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.terminal import tmux_environment
from tuiprof.tui.terminal_diff import ScreenDiff

MOVE_HOME = "\x1b[1;1H"
RED = "\x1b[38;2;255;0;0m"


def test_an_unchanged_frame_sends_only_the_cursor_and_a_changed_cell_only_itself() -> None:
    diff = ScreenDiff(lambda: (20, 2))
    frame = f"\x1b[1;1H{RED}util 97%\x1b[0m   \x1b[2;1Hpower 651 W\x1b[1;20H"
    assert "util 97%" in diff.filter(frame)  # the first frame: everything is new
    assert diff.filter(frame) == "\x1b[1;20H"  # the same frame: only where Textual leaves the cursor
    changed = diff.filter(frame.replace("97%", "98%"))
    assert changed == f"\x1b[1;7H\x1b[0m{RED}8\x1b[0m\x1b[1;20H"


def test_a_new_size_or_an_erase_sends_the_next_frame_whole() -> None:
    size = [(20, 2)]
    diff = ScreenDiff(lambda: size[0])
    frame = "\x1b[1;1Hload 1.00"
    diff.filter(frame)
    size[0] = (30, 2)
    assert "load 1.00" in diff.filter(frame)
    diff.filter("\x1b[2J")
    assert "load 1.00" in diff.filter(frame)


def test_an_erase_inside_drawn_text_is_passed_on_and_the_next_frame_goes_whole() -> None:
    """An op name holding ESC [ K once crashed the console here (KeyError: the screen forgotten before the
    cells drawn just before the erase were sent)."""
    diff = ScreenDiff(lambda: (40, 3))
    frame = "\x1b[1;1Hop all_reduce\x1b[K\x1b[2;1Hnext line"
    first = diff.filter(frame)
    assert "op all_reduce" in first and "\x1b[K" in first and "next line" in first
    assert "op all_reduce" in diff.filter(frame)  # the erase made it forget: sent whole again


def test_no_clipboard_write_or_title_reaches_the_terminal() -> None:
    diff = ScreenDiff(lambda: (40, 3))
    frame = ("\x1b[1;1Hname\x1b]52;c;ZXZpbA==\x07 \x1b]0;owned\x1b\\ \x1b]8;;https://x.test\x1b\\link"
             "\x1b]8;;\x1b\\")
    out = diff.filter(frame)
    assert "\x1b]52" not in out and "\x1b]0;" not in out
    assert "\x1b]8;;https://x.test\x1b\\" in out  # a hyperlink is Rich's: kept


@given(st.lists(st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.sampled_from(["\x1b[K", "\x1b[2J", "\x1b[0m", "\x1b[1m", "\x1b[3;4H", "\x1b[H", "\x1b]52;c;aGk=\x07",
                     "\x1b]0;t\x1b\\", "\x1b[?1049h", "\x1b[?2026h", "\x1b[?2026l", "\x1b(B", "\x1bc", "\r", "\n",
                     "\x1b[99;99H", "\x1b[0;0H"])), max_size=40))
def test_any_stream_is_filtered_without_error_and_no_osc_but_links_passes(parts) -> None:
    diff = ScreenDiff(lambda: (20, 5))
    for chunk in ("".join(parts), "".join(reversed(parts))):
        out = diff.filter(chunk)
        assert "\x1b]52" not in out and "\x1b]0;" not in out


def test_wide_characters_take_two_cells() -> None:
    diff = ScreenDiff(lambda: (10, 1))
    diff.filter("\x1b[1;1Hab界cd")
    assert diff.filter("\x1b[1;1HabXYcd") == "\x1b[1;3H\x1b[0mXY\x1b[0m\x1b[1;7H"
    assert diff.filter("\x1b[1;1Hab界cd") == "\x1b[1;3H\x1b[0m界\x1b[0m\x1b[1;7H"


APP = textwrap.dedent("""
    from textual.app import App
    from textual.widgets import DataTable, Static

    class Demo(App):
        def compose(self):
            yield Static("温度 · load 1.00", id="line")
            yield DataTable(zebra_stripes=True)

        def on_mount(self):
            table = self.query_one(DataTable)
            table.add_columns("GPU", "Util", "Power")
            for gpu in range(4):
                table.add_row(str(gpu), "90%", "600 W", key=str(gpu))
            self.step = 0
            self.set_interval(0.05, self.tick)

        def tick(self):
            self.step += 1
            table = self.query_one(DataTable)
            table.update_cell(str(self.step % 4), table.ordered_columns[1].key, f"{90 + self.step % 9}%")
            self.query_one("#line", Static).update(f"温度 · load {1 + self.step / 100:.2f}")
            if self.step == 40:
                self.exit()

    Demo().run()
""")


def raw_output(columns: int, lines: int) -> str:
    """What the app above writes to a terminal of this size, up to leaving the alternate screen."""
    pid, master = pty.fork()
    if pid == 0:
        os.environ.update(TERM="xterm-256color", COLORTERM="truecolor", COLUMNS=str(columns), LINES=str(lines))
        os.execv(sys.executable, [sys.executable, "-c", APP])
    import fcntl
    import struct
    import termios

    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    chunks = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    leaving = text.find("\x1b[?2004l")  # the app restores the terminal: its last frame is drawn
    return text[:leaving] if leaving >= 0 else text


def shown_by_tmux(stream: str, columns: int, lines: int, tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.stream"
    path.write_text(stream)
    tmux = ["tmux", "-L", f"tuiprof-diff-{os.getpid()}-{name}", "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", str(columns), "-y", str(lines), f"cat {path}; sleep 60"],
                   check=True, env=tmux_environment(TERM="xterm-256color"))
    try:
        time.sleep(1.0)
        return subprocess.run([*tmux, "capture-pane", "-p", "-e", "-a"], capture_output=True, text=True,
                              check=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is the terminal emulator of this test")
def test_a_real_textual_stream_and_its_changes_show_the_same_screen(tmp_path) -> None:
    columns, lines = 60, 12
    raw = raw_output(columns, lines)
    assert "load 1.39" in raw
    diff = ScreenDiff(lambda: (columns, lines))
    # Written in pieces cut anywhere between escape sequences, as a terminal may receive them.
    pieces, start = [], 0
    while start < len(raw):
        end = raw.find("\x1b", start + 500)
        end = len(raw) if end < 0 else end
        pieces.append(raw[start:end])
        start = end
    filtered = "".join(diff.filter(piece) for piece in pieces)
    assert len(filtered) < len(raw) * 0.6
    assert shown_by_tmux(filtered, columns, lines, tmp_path, "filtered") == shown_by_tmux(
        raw, columns, lines, tmp_path, "raw")


def test_a_frame_goes_to_the_terminal_in_one_write() -> None:
    """Textual writes a frame as begin-update, frame, end-update: one hand-off to its output thread
    and one system call each; the console hands the three over as one."""
    from types import SimpleNamespace

    from tuiprof.tui.terminal_diff import SYNC_END, SYNC_START, send_only_changes

    written: list[str] = []
    driver = SimpleNamespace(write=written.append, is_inline=False)
    app = SimpleNamespace(_driver=driver, is_headless=False, size=SimpleNamespace(width=20, height=2))
    send_only_changes(app)  # type: ignore[arg-type]
    for frame in ("util 97%", "util 98%"):
        driver.write(SYNC_START)
        driver.write(f"{MOVE_HOME}{frame}\x1b[1;20H")
        driver.write(SYNC_END)
    driver.write("\x1b[?25l")  # outside a frame: as it comes
    assert written == [f"{SYNC_START}\x1b[1;1H\x1b[0mutil 97%\x1b[0m\x1b[1;20H{SYNC_END}",
                       f"{SYNC_START}\x1b[1;7H\x1b[0m8\x1b[0m\x1b[1;20H{SYNC_END}", "\x1b[?25l"]
