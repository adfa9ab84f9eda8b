"""Small text renderings shared by the screens: sparklines and styled readings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.visual import VisualType
from textual.widgets import Static

from tuiprof.model import units
from tuiprof.model.values import Reading, Unavailable

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, top: float | None = None) -> str:
    """The last ``width`` values as block characters, scaled to ``top`` (or their max)."""
    recent = list(values)[-width:]
    if not recent:
        return ""
    peak = top if top is not None else max(recent)
    if peak <= 0:
        return _BLOCKS[0] * len(recent)
    steps = len(_BLOCKS) - 1
    return "".join(_BLOCKS[max(0, min(steps, round(v / peak * steps)))] for v in recent)


def reading(value: Reading, formatter: Callable[[Reading], str]) -> Text:
    """A formatted reading; unavailable ones dimmed as ``n/a`` (the reason goes in the detail line)."""
    if isinstance(value, Unavailable):
        return Text(units.NA, style="dim italic")
    return Text(formatter(value))


def pair(first: Reading, second: Reading, formatter: Callable[[Reading], str]) -> Text:
    """``avg/min`` style cell; n/a when the first is unavailable."""
    if isinstance(first, Unavailable):
        return Text(units.NA, style="dim italic")
    return Text(f"{formatter(first)}/{formatter(second)}")


_UNIT_SUFFIXES = ("_bytes_per_s", "_seconds_per_s", "_unix_seconds", "_per_s", "_bytes", "_seconds", "_percent",
                  "_hz", "_watts", "_celsius")
_CAPITALS = {"cpu": "CPU", "gpu": "GPU", "sm": "SM", "gc": "GC", "irq": "IRQ", "uid": "UID", "pid": "PID",
             "nvlink": "NVLink", "pcie": "PCIe", "gpm": "GPM", "nvml": "NVML", "nccl": "NCCL", "ecc": "ECC",
             "dram": "DRAM", "fp16": "FP16", "fp32": "FP32", "fp64": "FP64", "gemm": "GEMM", "numa": "NUMA",
             "mips": "MIPS", "ipc": "IPC", "iops": "IOPS", "rx": "rx", "tx": "tx"}


def field_label(name: str) -> str:
    """A reading's field name in words, its unit left to the cell: ``used_memory_bytes`` ->
    ``used memory``, ``nvlink_rx_bytes_per_s`` -> ``NVLink rx``, ``sm_percent`` -> ``SM``."""
    for suffix in _UNIT_SUFFIXES:
        if name.endswith(suffix) and name != suffix.lstrip("_"):
            name = name.removesuffix(suffix)
            break
    return " ".join(_CAPITALS.get(word, word) for word in name.split("_"))


def reasons(named: dict[str, Reading]) -> list[str]:
    """``reading, reading: n/a (reason)`` for every unavailable reading, grouped by reason, each
    reading named in words (``field_label``)."""
    grouped: dict[str, list[str]] = {}
    for name, value in named.items():
        if isinstance(value, Unavailable):
            grouped.setdefault(value.reason, []).append(field_label(name))
    return [f"{', '.join(names)}: n/a ({reason})" for reason, names in grouped.items()]


def set_content(widget: Static, content: VisualType) -> None:
    """Show ``content`` in ``widget``, redrawing nothing when it is what the widget shows.

    ``Static.update`` always repaints (and re-lays out) the widget; a screen redrawn
    every second with the same line would send it to the terminal every second. A
    layout pass of the whole screen is the console's largest cost after drawing table
    rows (bench/console/console_cpu_profile.md): it is skipped when the new text takes the
    room the old one did.
    """
    old = widget.content
    if old != content:
        widget.update(content, layout=not _same_room(widget, old, content))


def _same_room(widget: Static, old: VisualType, new: VisualType) -> bool:
    """Whether ``new`` needs exactly the room of ``old`` in ``widget``: both plain text (or
    markup, whose visible text is never longer) with as many lines, none wider than the
    widget's content area (no wrapping), in a widget whose width does not follow its content.
    """
    if not (isinstance(old, str | Text) and isinstance(new, str | Text)):
        return False
    width = widget.styles.width  # None: not set, the widget spans its container
    if width is not None and width.is_auto:
        return False
    room = widget.content_region.width
    old_lines, new_lines = str(old).split("\n"), str(new).split("\n")
    return (len(old_lines) == len(new_lines) and room > 0
            and all(cell_len(line) <= room for line in old_lines + new_lines))
