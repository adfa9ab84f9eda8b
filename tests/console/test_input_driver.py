"""The console's input thread in a real terminal (tui/driver.py): it sleeps while no key comes,
a lone Esc still becomes the Escape key, and q ends the console at once."""

from __future__ import annotations

import fcntl
import os
import pathlib
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from console.recordings import GPU_FIXTURE


class Terminal:
    """``tuiprof replay`` of the GPU recording in a pseudo-terminal; what it writes is kept."""

    def __init__(self) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tuiprof.cli", "replay", str(GPU_FIXTURE), "--speed", "0"],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            env={**os.environ, "TERM": "xterm-256color"})
        os.close(slave)
        self.master = master
        self.output = bytearray()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while select.select([self.master], [], [], 30)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the console closed its terminal
                return
            if not chunk:
                return
            self.output += chunk

    def press(self, keys: bytes) -> int:
        """Send ``keys``; how much output there was before them."""
        before = len(self.output)
        os.write(self.master, keys)
        return before

    def wait_for(self, text: str, since: int = 0, seconds: float = 30) -> None:
        wait(lambda: text.encode() in self.output[since:], seconds, f"{text!r} on the terminal")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        os.close(self.master)


def wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.05)


def select_threads(pid: int) -> list[pathlib.Path]:
    """The threads of ``pid`` blocked in select(2): the input thread (the event loop waits in
    epoll_wait, the output thread on a futex). The kernel names select's wait after poll's."""
    return [task for task in pathlib.Path(f"/proc/{pid}/task").iterdir()
            if (task / "wchan").read_text().startswith(("poll_schedule_timeout", "do_select", "core_sys_select"))]


def wakeups(task: pathlib.Path) -> int:
    status = (task / "status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_input_thread_sleeps_until_a_key_and_esc_and_q_still_work() -> None:
    terminal = Terminal()
    try:
        terminal.wait_for("gpu-node-01")
        wait(lambda: len(select_threads(terminal.process.pid)) == 1, 10, "input thread waiting in select")
        [input_thread] = select_threads(terminal.process.pid)
        before = wakeups(input_thread)
        time.sleep(2.0)
        assert wakeups(input_thread) - before <= 1  # Textual's own input thread wakes every 100 ms: 20 here

        terminal.wait_for("Processes on GPU", terminal.press(b"\r"))  # Enter: gpu-node-01's view
        terminal.wait_for("Trend", terminal.press(b"\x1b"))  # a lone Esc: back to the cluster view
        terminal.press(b"q")
        terminal.process.wait(5)
        assert terminal.process.returncode == 0
    finally:
        terminal.stop()


def test_textuals_own_driver_is_used_when_its_parser_is_not_the_expected_one(monkeypatch) -> None:
    from tuiprof.tui import textual_compat

    class ParserOfAnotherTextual:
        def __init__(self, debug: bool) -> None:
            self.debug = debug

    assert textual_compat.input_parser_as_expected()
    monkeypatch.setattr(textual_compat, "XTermParser", ParserOfAnotherTextual)
    assert not textual_compat.input_parser_as_expected()
    monkeypatch.setattr(textual_compat, "XTermParser", None)
    assert not textual_compat.input_parser_as_expected()
