"""The console's terminal driver: Textual's Linux driver with an input thread that sleeps
until there is something to read.

Textual's input thread wakes every 100 ms, to see whether it should stop and whether
a lone Esc has waited long enough to be the Escape key rather than the start of a
sequence. Ten wake-ups a second cost ~1.1 ms of CPU per second on the development VM,
a fifth of what the whole console used there watching one host
(bench/console/console_cpu_profile.md). This thread waits for a key, for the Esc timeout
only while one is pending, or for a byte on its own pipe, which ``disable_input``
writes when the driver stops (or suspends) the thread.
"""

from __future__ import annotations

import codecs
import os
import selectors

from textual.app import App
from textual.drivers.linux_driver import LinuxDriver

from tuiprof.tui.textual_compat import (
    XTermParser, escape_due, input_parser_as_expected, key_parser, key_thread_running, textual_clock,
)


class _InputWaitingDriver(LinuxDriver):
    """A ``LinuxDriver`` whose input thread takes no CPU while no key comes."""

    def __init__(self, app: App, *, debug: bool = False, mouse: bool = True,
                 size: tuple[int, int] | None = None) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)

    def disable_input(self) -> None:
        """Wake the input thread so that it ends, then let Textual stop and join it."""
        if not self.exit_event.is_set() and key_thread_running(self):
            os.write(self._wake_write, b"x")
        super().disable_input()

    def close(self) -> None:
        super().close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def run_input_thread(self) -> None:
        """Read keys (and mouse, paste, resize reports) until ``disable_input`` wakes the thread."""
        self._drain_wake_pipe()  # a byte left by a stop that found the thread already gone
        parser = key_parser(self)
        decode = codecs.getincrementaldecoder("utf-8")().decode
        with selectors.SelectSelector() as selector:  # as Textual's: select() works on any terminal fd
            selector.register(self.fileno, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                due = escape_due(parser)  # set while a lone Esc waits to become the Escape key
                timeout = None if due is None else max(0.0, due - textual_clock())
                ready = [key.fd for key, _ in selector.select(timeout)]
                if self.fileno in ready:
                    data = os.read(self.fileno, 4096)
                    if data:
                        self._feed(parser, decode(data))
                    else:  # end of input (stdin is no terminal): nothing more to read, wait for the stop
                        selector.unregister(self.fileno)
                for message in parser.tick():
                    self.process_message(message)
                if self._wake_read in ready:
                    break
            # Keys typed just before the stop still count, as in Textual's own thread.
            selector.unregister(self._wake_read)
            if selector.get_map() and selector.select(0.1):
                self._feed(parser, decode(os.read(self.fileno, 4096), final=True))
        self._drain_wake_pipe()

    def _feed(self, parser: XTermParser, text: str) -> None:
        """Hand ``text`` to the parser and its events to the app (nothing: a character still incomplete)."""
        for message in parser.feed(text) if text else ():
            self.process_message(message)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_read, 64):
                pass
        except BlockingIOError:
            pass


# Textual's own driver where its parser is not the one this was written for: a console that
# wakes ten times a second is better than one that does not start.
InputWaitingDriver: type[LinuxDriver] = _InputWaitingDriver if input_parser_as_expected() else LinuxDriver
