"""Render every console view at 120×40 (some at another size) from a recording into SVGs (used in the README).

    .venv/bin/python screenshots/make.py [RECORDING.ndjson [OUT_DIR]]

Default recording: 90 s of the synthetic GPU fixture (values made up for the
picture, see tests/console/gpu_fixture.py), generated in memory; output: this
directory. The CPU-only view comes from the real two-agent recording.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

from tuiprof.client.sources import ReplaySource
from tuiprof.model import record
from tuiprof.model.events import HostEvent
from tuiprof.tui.app import TuiprofApp

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "console" / "data"
SIZE = (120, 40)

VIEWS: dict[str, list[str]] = {
    "cluster": [],
    "cluster-filter": ["slash", *"util<10", "enter"],
    "host-gpus": ["enter"],
    "host-ranks": ["enter", "4"],
    "host-history": ["enter", "6"],
    "job-ops": ["n"],
    "help": ["question_mark"],
    "cluster-80x24": [],
    "host-gpus-80x24": ["enter"],
}
SIZES = {"host-history": (120, 110), "cluster-80x24": (80, 24), "host-gpus-80x24": (80, 24)}
"""Views shot at another size: every plot of the History tab; the smallest terminal the console is made for."""


async def shoot(events: list[HostEvent], name: str, keys: list[str], out: pathlib.Path) -> pathlib.Path:
    app = TuiprofApp(ReplaySource(events, speed=0))
    async with app.run_test(size=SIZES.get(name, SIZE)) as pilot:
        for _ in range(200):
            await pilot.pause(0.02)
            if app.cluster.version and not app._inbox:
                break
        await pilot.press(*keys)
        await pilot.pause(0.3)
        path = out / f"{name}.svg"
        path.write_text(app.export_screenshot(title=f"tuiprof — {name}"))
        return path


async def main(events: list[HostEvent], out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, keys in VIEWS.items():
        print(await shoot(events, name, keys, out))
    cpu_only = list(record.read(DATA / "agents-2hosts.ndjson"))
    print(await shoot(cpu_only, "cpu-only-host", ["enter", "2"], out))


def fixture_events() -> list[HostEvent]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from console.gpu_fixture import events

    return events(seconds=90, down_at=80)


if __name__ == "__main__":
    args = sys.argv[1:]
    chosen = list(record.read(args[0])) if args else fixture_events()
    asyncio.run(main(chosen, pathlib.Path(args[1]) if len(args) > 1 else HERE))
