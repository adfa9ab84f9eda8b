"""History plots with a time axis and units (textual-plotext), over a window the user picks.

The host view's History tab draws the host-wide series the cluster state keeps
for every host, and per-GPU and per-core series the console keeps only for the
hosts it shows in detail (``detail_samples``): a thousand hosts × 8 GPUs ×
hundreds of cores of history would cost more memory than the rest of the console.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model.behaviour import busy, ratio_percent
from tuiprof.model.summary import reading as proto_reading
from tuiprof.model.values import Reading

WINDOWS: tuple[tuple[str, float | None], ...] = (
    ("1 min", 60.0), ("5 min", 300.0), ("15 min", 900.0), ("all", None),
)
"""The plots' time windows, in the order a key cycles them; None: all the history the console holds."""
WINDOW_NAMES = tuple(name for name, _ in WINDOWS)
MAX_LINES = 8
"""Lines one plot draws (more cannot be told apart); the busiest are kept and the title says so."""


def detail_samples(message: pb.HostSnapshot) -> Iterator[tuple[str, Reading]]:
    """Per-GPU utilization, memory used (%) and power, and per-core busy, from the wire message."""
    for gpu in message.gpus:
        yield f"gpu{gpu.index}.util", proto_reading(gpu, "utilization_percent")
        yield f"gpu{gpu.index}.memory", ratio_percent(
            proto_reading(gpu, "memory_used_bytes"), proto_reading(gpu, "memory_total_bytes"))
        yield f"gpu{gpu.index}.power", proto_reading(gpu, "power_watts")
    for core in message.cpu.cores:
        yield f"core{core.cpu}.busy", busy(proto_reading(core, "idle_percent"))


Points = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Line:
    label: str
    points: Points


def busiest(lines: Sequence[Line], keep: int = MAX_LINES) -> list[Line]:
    """The ``keep`` lines with the highest latest value, in their original order."""
    if len(lines) <= keep:
        return list(lines)
    ranked = sorted(lines, key=lambda line: line.points[-1][1] if line.points else float("-inf"), reverse=True)
    kept = {id(line) for line in ranked[:keep]}
    return [line for line in lines if id(line) in kept]


def _duration(seconds: float) -> str:
    """``30s``, ``5m``, ``1.5m``, ``2.5h``."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m" if seconds % 60 < 1 else f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _age(seconds: float) -> str:
    """Tick label for ``seconds`` before now: ``now``, ``-30s``, ``-5m``, ``-1.5h``."""
    return "now" if seconds < 0.5 else f"-{_duration(seconds)}"


def time_ticks(span: float, count: int = 5) -> list[float]:
    """Tick positions (negative seconds, ending at 0) at a round step for ``span`` seconds."""
    steps = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
    step = next((s for s in steps if span / s <= count), steps[-1])
    ticks, at = [], 0.0
    while at <= span + 1e-9:
        ticks.append(-at)
        at += step
    return sorted(ticks)


class HistoryPlot(PlotextPlot):
    """One plot: a title with the unit and window, time (seconds before now) along x."""

    DEFAULT_CSS = """
    HistoryPlot { height: 10; width: 1fr; }
    """

    def show(self, title: str, lines: Sequence[Line], formatter: Callable[[Reading], str],
             top: float | None, now: float, window: str) -> None:
        """Draw ``lines`` (points in Unix seconds) over ``window`` (one of ``WINDOW_NAMES``) before ``now``."""
        seconds = dict(WINDOWS)[window]
        since = now - seconds if seconds is not None else min(
            (p[0] for line in lines for p in line.points), default=now)
        shown = [Line(line.label, [p for p in line.points if p[0] >= since]) for line in lines]
        shown = [line for line in shown if line.points]
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        span = max(now - since, 1.0)
        oldest = min((p[0] for line in shown for p in line.points), default=now)
        # a window the history does not fill yet says how much it holds
        held = "" if seconds is None or oldest - since < seconds / 10 else f" ({_duration(now - oldest)} of history)"
        plt.title(f"{title} · window {window}{held}" if shown else f"{title} · no samples in the window ({window})")
        for line in shown:
            plt.plot([at - now for at, _ in line.points], [value for _, value in line.points],
                     label=line.label if len(shown) > 1 else None, marker="braille")
        plt.xlim(-span, 0)
        ticks = time_ticks(span)
        plt.xticks(ticks, [_age(-t) for t in ticks])
        peak = top if top is not None else max((v for line in shown for _, v in line.points), default=1.0) or 1.0
        plt.ylim(0, peak)
        levels = [0.0, peak / 2, peak]
        plt.yticks(levels, [formatter(level) for level in levels])
        self.refresh()
