"""Human formatting of readings, always with their unit; unavailable shows as ``n/a``."""

from __future__ import annotations

from tuiprof.model.values import Reading, Unavailable

NA = "n/a"

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_DECIMAL = ("", "k", "M", "G", "T", "P")


def _scaled(value: float, base: float, names: tuple[str, ...]) -> tuple[float, str]:
    index = 0
    while abs(value) >= base and index < len(names) - 1:
        value /= base
        index += 1
    return value, names[index]


def _number(value: float) -> str:
    """Three significant digits, enough to compare hosts at a glance; zero is ``0``."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def percent(value: Reading) -> str:
    return NA if isinstance(value, Unavailable) else f"{value:.0f}%"


def bytes_(value: Reading) -> str:
    if isinstance(value, Unavailable):
        return NA
    scaled, unit = _scaled(float(value), 1024.0, _BINARY)
    return f"{_number(scaled)} {unit}"


def bytes_per_s(value: Reading) -> str:
    if isinstance(value, Unavailable):
        return NA
    scaled, unit = _scaled(float(value), 1000.0, _DECIMAL)
    return f"{_number(scaled)} {unit}B/s"


def per_s(value: Reading, unit: str = "/s") -> str:
    if isinstance(value, Unavailable):
        return NA
    scaled, prefix = _scaled(float(value), 1000.0, _DECIMAL)
    return f"{_number(scaled)} {prefix}{unit}".rstrip()  # no unit (a count): no trailing space


def seconds(value: Reading) -> str:
    """Durations from microseconds to hours, e.g. ``850 µs``, ``1.24 s``, ``3.0 min``."""
    if isinstance(value, Unavailable):
        return NA
    v = float(value)
    if v == 0:
        return "0 s"
    if v < 1e-3:
        return f"{_number(v * 1e6)} µs"
    if v < 1:
        return f"{_number(v * 1e3)} ms"
    if v < 120:
        return f"{_number(v)} s"
    if v < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


def elapsed(value: Reading) -> str:
    """How long something has run, as ``ps`` writes it (etime): ``mm:ss``, ``h:mm:ss``, ``d-hh:mm:ss``."""
    if isinstance(value, Unavailable):
        return NA
    minutes, second = divmod(int(value), 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    if days:
        return f"{days}-{hour:02d}:{minute:02d}:{second:02d}"
    return f"{hour}:{minute:02d}:{second:02d}" if hour else f"{minute:02d}:{second:02d}"


def watts(value: Reading) -> str:
    return NA if isinstance(value, Unavailable) else f"{value:.0f} W"


def celsius(value: Reading) -> str:
    return NA if isinstance(value, Unavailable) else f"{value:.0f} °C"


def hertz(value: Reading) -> str:
    if isinstance(value, Unavailable):
        return NA
    scaled, prefix = _scaled(float(value), 1000.0, _DECIMAL)
    return f"{_number(scaled)} {prefix}Hz"


def tflops(value: Reading) -> str:
    return NA if isinstance(value, Unavailable) else f"{value:.1f} TFLOP/s"


def plain(value: Reading, digits: int = 2) -> str:
    if isinstance(value, Unavailable):
        return NA
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def ago(seconds_since: float, just_now: float = 1.0) -> str:
    """``12 s ago`` style age of a past event, in whole seconds (finer steps would change the
    text on every redraw, and the terminal be sent it again); under ``just_now`` s, "just now"."""
    if seconds_since < just_now:
        return "just now"
    return f"{int(seconds_since)} s ago" if seconds_since < 120 else f"{seconds(seconds_since)} ago"
