"""The tuiprof console: one Textual app over a ClusterState fed by an event source.

Data flow: the source (live agents or a recording) runs in one async worker and
calls ``_receive`` for every host event; events queue in an inbox and one
``EventsPending`` message per batch tells the app to apply them to the cluster
state. Screens render from that state in batches, never per event: a change to a
host the screen shows (its ``shows(address)``, e.g. a row on screen) is drawn
``GATHER_S`` after it came (at once when one host is watched), at most
``SHOWN_RENDER_HZ`` times a second; any other
change (a host scrolled out of view, any change on a screen without ``shows``)
at most ``BACKGROUND_RENDER_HZ`` times a second. With a thousand hosts answering
every second the rows on screen change about ten times a second; the rest only
move rows or the title, which can wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import pathlib
import time
from collections.abc import Callable
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.driver import Driver
from textual.timer import Timer
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from tuiprof.analysis.slowdown import ClusterSlowdowns
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.settings import SettingsFile
from tuiprof.client.sources import EventSource, LiveSource, LocalSource
from tuiprof.model.cluster import ClusterState
from tuiprof.model.events import HostEvent, SnapshotReceived
from tuiprof.model.history import History
from tuiprof.model.settings import Settings
from tuiprof.tui.columns import ColumnsScreen, hidden_in, with_hidden
from tuiprof.tui.messages import EventsPending, PmuShown, SourceEnded
from tuiprof.tui.palette import GoToProvider
from tuiprof.tui.plots import WINDOW_NAMES, detail_samples
from tuiprof.tui.source_features import AsksAgents, FleetView, Pausable, SamplesPmu
from tuiprof.tui.terminal_diff import send_only_changes

BACKGROUND_RENDER_HZ = 2.0
SHOWN_RENDER_HZ = 10.0
GATHER_S = 0.03
"""Wait this long after the first new event before drawing: agents on the same
interval answer in a burst, and one frame should show the whole burst."""
SOURCE_CLOSE_S = 5.0
"""At exit, the longest the app waits for its source to close (this host's agent to stop)."""
TICK_S = 1.0
"""Live mode: with nothing drawn, the clock is advanced and the screen drawn this often."""
FIRST_TICK_S = 1.5 * TICK_S
"""Live mode: the first tick after a drawing. News on a 1 s interval comes about ``TICK_S``
after the last, so a tick then would mostly come a moment before it and wake the loop for
nothing (one wakeup a second on the GPU VM, bench/console/console_nvitop.md run 10)."""
FREEZE_AFTER_S = 15.0
"""Live mode: this long after start the fleet is connected, and what is alive then
(widgets, a stream and a model per host) lives as long as the console. ``gc.freeze``
takes it out of Python's full collections, which otherwise re-scan it several
times a minute: at 1024 hosts each one stopped the event loop for ~80 ms, and a
key press or a frame waited that long (~20 ms frozen; bench/console/console_fleet.md)."""
DETAIL_HOSTS = 8
"""Per-GPU and per-core history is kept for the first this many hosts that answer, and for
any host whose view is opened (from then on): 1.3 MB a host of 96 cores and 8 GPUs
(bench/console/console_detail_history.md), so a whole fleet's would cost more memory than the
rest of the console."""
INTERVAL_KEYS = Binding.Group("Interval", compact=True)
"""`-` and `+` show as one footer entry."""
INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
"""The refresh intervals `-` and `+` step through (seconds between snapshots)."""


class TuiprofApp(App[None]):
    """Cluster → host → rank views over live agents or a recording."""

    CSS_PATH = pathlib.Path(__file__).with_name("tuiprof.tcss")
    """Absolute, so subclasses defined elsewhere (benchmarks) find it too."""
    TITLE = "tuiprof"
    COMMANDS = App.COMMANDS | {GoToProvider}
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("n", "job_ops", "Ops", tooltip="NCCL/GEMM ops across the job"),
        Binding("t", "traces", "Traces"),
        Binding("s", "stacks", "Stacks"),
        Binding("T", "toggle_theme", "Light/dark", show=False),
        Binding("space", "toggle_replay", "Pause", key_display="␣", tooltip="pause or play the recording"),
        Binding("R", "reconnect", "Reconnect now", show=False),
        Binding("minus", "interval(-1)", "Shorter interval", key_display="-", group=INTERVAL_KEYS),
        Binding("plus", "interval(1)", "Longer interval", key_display="+", group=INTERVAL_KEYS),
    ]

    def __init__(
        self,
        source: EventSource,
        connection: ConnectionOptions | None = None,
        clock: Callable[[], float] = time.time,
        settings_file: SettingsFile | None = None,
        open_only_host: bool = False,
    ) -> None:
        super().__init__()
        self._open_only_host = open_only_host
        """Open the host view once the only watched host sends its first snapshot (a cluster table of one row
        leaves the screen empty); on a host without GPUs, on its CPU tab."""
        self.settings_file = settings_file
        """Where the settings are loaded from and saved to; None: defaults, nothing saved (tests)."""
        self.settings, warning = settings_file.load() if settings_file else (Settings(), None)
        self._warnings = [warning] if warning else []
        self.source = source
        self.connection = connection or (source.options if isinstance(source, AsksAgents) else ConnectionOptions())
        """How screens that make their own calls (traces, stacks) reach the agents (by default as the
        source does: its options also know which agent runs in this process)."""
        self.cluster = ClusterState(source.hosts)
        self.slowdowns = ClusterSlowdowns()
        """The slowdown verdict of every job, its collectives joined across all watched hosts."""
        self._clock = clock
        self._inbox: list[HostEvent] = []
        self._rendered_version = -1
        self._last_render = 0.0
        self._render_timer: Timer | None = None
        self._tick_timer: Timer | None = None
        self._render_due = 0.0
        self.detail_history: dict[str, History] = {}
        """Per-GPU and per-core series (``plots.detail_samples``) of the hosts shown in detail."""
        self._replayed_to: float | None = None
        """The recording's time (unix s) of the last event replayed; None live or before the first."""
        self.sub_title = "live" if source.live else "replay"
        self._show_interval()
        self._show_replay()

    def get_driver_class(self) -> type[Driver]:
        """Where Textual would take its Linux driver, the one whose input thread sleeps until a key
        comes (``tui/driver.py``: ~1 ms of CPU a second less); otherwise Textual's choice."""
        chosen = super().get_driver_class()
        if chosen.__name__ != "LinuxDriver":  # Windows, or one named in $TEXTUAL_DRIVER
            return chosen
        from tuiprof.tui.driver import InputWaitingDriver  # imports termios: POSIX only

        return InputWaitingDriver

    def on_mount(self) -> None:
        from tuiprof.tui.screens.cluster import ClusterScreen

        send_only_changes(self)  # a few changed cells a second, not whole lines (bench/console/console_nvitop.md)

        if self.settings.history_window not in WINDOW_NAMES:
            self._warnings.append(f"unknown history window '{self.settings.history_window}' in the settings; "
                                  f"using {Settings().history_window}")
            self.settings = dataclasses.replace(self.settings, history_window=Settings().history_window)
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        else:
            self._warnings.append(f"unknown theme '{self.settings.theme}' in the settings; using {self.theme}")
        self.push_screen(ClusterScreen(self.settings))
        for warning in self._warnings:
            self.notify(warning, title="Settings", severity="warning", markup=False)
        self._pump()
        if self.source.live:
            self._tick_timer = self.set_timer(FIRST_TICK_S, self._tick)
            self.set_timer(FREEZE_AFTER_S, gc.freeze)

    @work(exclusive=True, group="source", exit_on_error=False)
    async def _pump(self) -> None:
        await self.source.run(self._receive)
        self.post_message(SourceEnded())

    async def on_unmount(self) -> None:
        """End the source before the app's loop does: Textual cancels workers at exit without
        waiting for them, and this host's embedded agent, stopped as its worker ends, would
        outlive the console (its thread then dies with a traceback at interpreter exit)."""
        sources = [worker for worker in self.workers if worker.group == "source"]
        for worker in sources:
            worker.cancel()
        for worker in sources:  # a source slow to close (many hosts) does not hold the quit up long
            with contextlib.suppress(WorkerCancelled, WorkerFailed, TimeoutError):
                await asyncio.wait_for(worker.wait(), SOURCE_CLOSE_S)

    def _receive(self, event: HostEvent) -> None:
        if not self._inbox:
            self.post_message(EventsPending())
        self._inbox.append(event)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The source failed (e.g. the embedded agent could not start): leave, saying why."""
        if event.worker.group == "source" and event.state == WorkerState.ERROR:
            self.exit(return_code=1, message=f"tuiprof: {event.worker.error}")

    def on_events_pending(self, _: EventsPending) -> None:
        events, self._inbox = self._inbox, []
        unjudged: set[str] = set()  # hosts with a snapshot the slowdown verdict has not seen yet
        for event in events:
            if isinstance(event, SnapshotReceived) and event.host in unjudged:
                # a second snapshot of a host in one batch (a replay at full speed): judge the first
                self.slowdowns.observe(self.cluster.hosts(), self.cluster.now)
                unjudged.clear()
            self.cluster.apply(event)
            if isinstance(event, SnapshotReceived):
                unjudged.add(event.host)
                self._keep_detail(event)
        if unjudged:
            self.slowdowns.observe(self.cluster.hosts(), self.cluster.now)
        if events and not self.source.live:
            self._replayed_to = events[-1].at
            self._show_replay()
        if self._open_only_host:
            self._show_only_host(events)
        self.schedule_render(shown=self._on_screen(events))

    def _on_screen(self, events: list[HostEvent]) -> bool:
        """Whether any event changes what the current screen shows (a host coming up or
        going down always does: the title counts hosts up)."""
        shows = getattr(self.screen, "shows", None) if self.screen_stack else None
        return shows is not None and any(
            not isinstance(event, SnapshotReceived) or shows(event.host) for event in events)

    def _show_only_host(self, events: list[HostEvent]) -> None:
        snapshot = next((e for e in events if isinstance(e, SnapshotReceived)), None)
        if snapshot is None or len(self.cluster.hosts()) != 1 or len(self.screen_stack) > 2:
            return  # no snapshot yet, more than one host, or the user already went elsewhere
        self._open_only_host = False
        self.show_host(snapshot.host, tab=None if snapshot.message.gpus else "cpu")

    def _keep_detail(self, event: SnapshotReceived) -> None:
        history = self.detail_history.get(event.host)
        if history is None and len(self.detail_history) < DETAIL_HOSTS:
            history = self.detail_history[event.host] = History()
        if history is not None:
            history.extend(detail_samples(event.message), event.at)

    def on_pmu_shown(self, message: PmuShown) -> None:
        if isinstance(self.source, SamplesPmu):  # this host's embedded agent: it reads them only while shown
            self.source.sample_pmu(message.shown)

    def on_source_ended(self, _: SourceEnded) -> None:
        self.schedule_render()

    def _tick(self) -> None:
        """Live mode, ``FIRST_TICK_S`` after the last drawing, then every ``TICK_S``: advance the
        clock and draw, so "last contact N s ago" keeps counting while no news comes. Every
        drawing puts it off again, so while news comes every second it never fires (one wakeup
        a second less)."""
        self._tick_timer = self.set_timer(TICK_S, self._tick)
        self.cluster.tick(self._clock())
        self.render_views(force=True)

    def schedule_render(self, shown: bool = False) -> None:
        """Render after ``GATHER_S``, no more often than ``SHOWN_RENDER_HZ`` when the
        change is on screen (``shown``) or ``BACKGROUND_RENDER_HZ`` when it is not. One
        host has no burst to gather: its change is drawn at once when the rate allows (a
        timer would wake the loop once more a second, ~0.1 ms of CPU on a GPU VM)."""
        now = time.monotonic()
        rate = SHOWN_RENDER_HZ if shown else BACKGROUND_RENDER_HZ
        gather = GATHER_S if len(self.cluster.addresses()) > 1 else 0.0
        due = max(now + gather, self._last_render + 1 / rate)
        if self._render_timer is None and due <= now:
            self.render_views()
            return
        if self._render_timer is not None:
            if self._render_due <= due:
                return
            self._render_timer.stop()
        self._render_due = due
        self._render_timer = self.set_timer(due - now, self._timed_render)

    def _timed_render(self) -> None:
        self._render_timer = None
        self.render_views()

    def render_views(self, force: bool = False) -> None:
        """Draw the current screen's data if it changed; ``force``: also if not (the clock's tick)."""
        if not self.screen_stack:  # shutting down
            return
        screen = self.screen
        if not (screen.is_mounted and screen.is_running):  # mid start-up or shutdown
            return
        if not force and self.cluster.version == self._rendered_version:
            return
        self._rendered_version = self.cluster.version
        self._last_render = time.monotonic()
        if self._tick_timer is not None and not force:  # news drawn: the clock's tick is put off
            self._tick_timer.stop()
            self._tick_timer = self.set_timer(FIRST_TICK_S, self._tick)
        refresh = getattr(self.screen, "refresh_data", None)
        if refresh is not None:
            refresh()

    # ---------------------------------------------------------------- actions

    def action_help(self) -> None:
        from tuiprof.tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_job_ops(self) -> None:
        from tuiprof.tui.screens.job_ops import JobOpsScreen

        if isinstance(self.screen, JobOpsScreen):
            return
        screen = JobOpsScreen()
        if isinstance(self.source, FleetView):  # Prometheus mode: the ranks' hosts' agents over gRPC while it is open
            self.notify(self.source.attend_ranks(lambda: screen in self.screen_stack), title="NCCL/GEMM", markup=False)
        self.push_screen(screen)

    def action_traces(self) -> None:
        from tuiprof.tui.screens.traces import TracesScreen

        self._push_once(TracesScreen)

    def action_stacks(self) -> None:
        from tuiprof.tui.screens.stacks import StacksScreen

        self._push_once(StacksScreen)

    def _push_once(self, screen_type: type) -> None:
        if not isinstance(self.screen, screen_type):
            self.push_screen(screen_type())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Pause/play exists only over a recording, reconnecting only over live agents."""
        if action == "toggle_replay":
            return not self.source.live
        if action == "reconnect":
            return self.source.live
        if action == "interval":  # agents asked for an interval (Prometheus mode's opened hosts keep their own)
            return isinstance(self.source, LiveSource | LocalSource)
        return True

    def action_toggle_replay(self) -> None:
        source = self.source
        if not isinstance(source, Pausable):  # check_action offers the key over a recording only
            return
        if source.paused:
            source.resume()
        else:
            source.pause()
        self._show_replay()

    def action_reconnect(self) -> None:
        """Hosts that are down try again at once instead of at the end of their backoff."""
        if not isinstance(self.source, AsksAgents):  # check_action offers the key over live agents only
            return
        self.source.retry.trigger()
        down = sum(1 for h in self.cluster.hosts() if h.reachable is False)
        self.notify(f"reconnecting {down} host(s) now" if down else "every host is connected")

    def action_interval(self, step: int) -> None:
        """Ask the agents for snapshots more (-1) or less (+1) often, and remember it.

        Remote agents: the streams restart at once with the new interval. This host's
        embedded agent samples at the new interval from its next tick on (it keeps its
        port, so it stays the same host).
        """
        current = self.settings.interval_seconds or 1.0  # the agent's own interval is 1 s by default
        index = min(range(len(INTERVALS)), key=lambda i: abs(INTERVALS[i] - current))
        interval = INTERVALS[max(0, min(len(INTERVALS) - 1, index + step))]
        if interval == self.settings.interval_seconds:
            return
        self.remember(interval_seconds=interval)
        interval_ms = round(interval * 1000)
        match self.source:
            case LocalSource() as this_host:
                this_host.set_interval(interval_ms)
                self.connection = this_host.options
            case LiveSource() as agents:
                self.connection = dataclasses.replace(agents.options, interval_ms=interval_ms)
                self.source = dataclasses.replace(agents, options=self.connection)
                self._pump()  # exclusive: the old streams are cancelled
            case _:
                return  # a recording or Prometheus mode: check_action offers no interval keys
        self._show_interval()

    def _asks_agents(self) -> ConnectionOptions | None:
        """The options a source asks agents for snapshots with (live agents, this host's);
        None for a recording (its own pace) or a source that asks no agent."""
        return self.source.options if self.source.live and isinstance(self.source, AsksAgents) else None

    def _show_replay(self) -> None:
        """A recording says so in the header's title: replay or paused, and the recorded time reached
        (every screen's own subtitle takes the header's other half)."""
        if self.source.live:
            return
        state = "paused" if isinstance(self.source, Pausable) and self.source.paused else "replay"
        at = "" if self._replayed_to is None else time.strftime(" %H:%M:%S UTC", time.gmtime(self._replayed_to))
        self.sub_title = state
        self.title = f"{state}{at}"  # short: at 80 columns the screen's subtitle still fits beside it

    def _show_interval(self) -> None:
        """The interval in effect, in the header's title."""
        options = self._asks_agents()
        if options is not None:
            seconds = options.interval_ms / 1000
            self.title = f"tuiprof · every {seconds:g} s" if seconds else "tuiprof · agent's interval"

    def choose_columns(self, table: str, title: str, labels: list[str], apply: Callable[[set[str]], None]) -> None:
        """The column chooser over ``table``'s ``labels``; the choice is applied and remembered."""
        def chosen(hidden: frozenset[str] | None) -> None:
            if hidden is not None:
                apply(set(hidden))
                self.remember(hidden_columns=with_hidden(table, self.settings.hidden_columns, hidden))

        self.push_screen(ColumnsScreen(title, labels, self.hidden_columns(table)), chosen)

    def hidden_columns(self, table: str) -> set[str]:
        return hidden_in(table, self.settings.hidden_columns)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def watch_theme(self, theme: str) -> None:
        """Any theme change (T or the palette's theme picker) is remembered."""
        self.remember(theme=theme)

    def remember(self, **changes: Any) -> None:
        """Change settings and save them when they changed (a failed save says why, once per change);
        ``changes`` as ``dataclasses.replace`` takes them: a Settings field's name and its new value."""
        settings = dataclasses.replace(self.settings, **changes)
        if settings == self.settings:
            return
        self.settings = settings
        if self.settings_file is not None:
            failed = self.settings_file.save(settings)
            if failed:
                self.notify(failed, title="Settings", severity="warning", markup=False)

    def show_host(self, address: str, tab: str | None = None) -> None:
        """Drill into one host (from the cluster view, the op view or the palette)."""
        from tuiprof.tui.screens.host import HostScreen

        self.detail_history.setdefault(address, History())
        screen = HostScreen(address, tab=tab)
        if isinstance(self.source, FleetView):  # Prometheus mode: the host's own agent over gRPC while it is open
            self.source.attend(address, lambda: screen in self.screen_stack)
        self.push_screen(screen)
