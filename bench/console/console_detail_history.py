"""What the host view's per-GPU/per-core history and its plots cost.

    .venv/bin/python bench/console/console_detail_history.py

1. Memory: one host's detail history (``tui/plots.detail_samples`` into a
   ``History``) after 300 snapshots of 96 cores and 8 GPUs, measured with
   tracemalloc (Python allocations only).
2. Time, in a headless console at 120×40 over the synthetic 4-host recording of
   90 s (8 GPUs, 96 cores a host), median of 30 redraws: handing the History
   tab's 11 plots their data (``HostScreen._fill_history``), and rendering each
   plot (plotext builds it; Textual renders only the plots scrolled into view,
   three or four at 120×40).
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import time
import tracemalloc

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from tuiprof.client.sources import ReplaySource  # noqa: E402
from tuiprof.model.history import History  # noqa: E402
from tuiprof.tui.app import TuiprofApp  # noqa: E402
from tuiprof.tui.plots import detail_samples  # noqa: E402


def detail_history_bytes(cores: int = 96, gpus: int = 8, samples: int = 300) -> int:
    message = pb.HostSnapshot()
    for index in range(gpus):
        message.gpus.add(index=index, utilization_percent=50.0, memory_used_bytes=10, memory_total_bytes=80,
                         power_watts=300.0)
    for cpu in range(cores):
        message.cpu.cores.add(cpu=cpu, idle_percent=10.0)
    tracemalloc.start()
    history = History(samples)
    for at in range(samples):
        for core in message.cpu.cores:  # distinct floats, as real readings are
            core.idle_percent = (core.idle_percent + 0.37) % 100
        history.extend(detail_samples(message), float(at))
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return used


async def history_redraw_seconds(redraws: int = 30) -> tuple[list[float], dict[str, list[float]]]:
    from console.gpu_fixture import events

    app = TuiprofApp(ReplaySource(events(seconds=90, down_at=80), speed=0))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(200):
            await pilot.pause(0.02)
            if app.cluster.version and not app._inbox:
                break
        await pilot.press("enter", "6")
        await pilot.pause(0.3)
        screen = app.screen
        fills: list[float] = []
        renders: dict[str, list[float]] = {}
        for _ in range(redraws):
            started = time.perf_counter()
            screen._fill_history()
            fills.append(time.perf_counter() - started)
            for plot in screen.query("HistoryPlot"):
                started = time.perf_counter()
                plot.render()  # what a frame does for each plot in view
                renders.setdefault(str(plot.id), []).append(time.perf_counter() - started)
            await pilot.pause(0.02)
        return fills, renders


def main() -> None:
    print(f"detail history, 96 cores + 8 GPUs, 300 samples: {detail_history_bytes() / 1e6:.2f} MB")
    fills, renders = asyncio.run(history_redraw_seconds())
    print(f"data to the 11 plots: median {statistics.median(fills) * 1e3:.1f} ms over {len(fills)}")
    for plot, times in renders.items():
        print(f"render {plot}: median {statistics.median(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
