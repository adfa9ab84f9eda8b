"""Keeping every trace file under the agent's trace directory.

Clients name sub-directories (``output_subdir``) and files (``FetchFile.path``)
relative to the trace dir. Anything absolute, with ``..``, or resolving
(through symlinks) outside the directory is refused with a TracePathError,
which the gRPC layer turns into INVALID_ARGUMENT.
"""

from __future__ import annotations

import pathlib

# Kineto writes "<file>.tmp" and renames it when the trace is complete.
UNFINISHED_SUFFIX = ".tmp"


class TracePathError(ValueError):
    """A client-supplied path that would leave the trace directory, or is otherwise unusable."""


def _relative_parts(text: str, what: str) -> tuple[str, ...]:
    if "\x00" in text:
        raise TracePathError(f"{what} {text!r} contains a NUL character")
    path = pathlib.PurePosixPath(text)
    if path.is_absolute():
        raise TracePathError(f"{what} {text!r} is absolute; give a path relative to the agent's trace dir")
    if ".." in path.parts:
        raise TracePathError(f"{what} {text!r} contains '..'; paths must stay inside the agent's trace dir")
    return path.parts


def inside(root: pathlib.Path, text: str, what: str) -> pathlib.Path:
    """``root / text`` after checking it stays under ``root`` once symlinks are resolved."""
    parts = _relative_parts(text, what)
    base = root.resolve()
    candidate = base.joinpath(*parts)
    resolved = candidate.resolve()
    if resolved != base and base not in resolved.parents:
        raise TracePathError(
            f"{what} {text!r} resolves to {resolved}, outside the trace dir {base} (a symlink?)"
        )
    return resolved


def finished_file(root: pathlib.Path, text: str) -> pathlib.Path:
    """The regular, finished file ``text`` names under ``root`` (FileNotFoundError when absent)."""
    if not text:
        raise TracePathError("no file named: give a path relative to the trace dir, as CaptureTrace reported it")
    if text.endswith(UNFINISHED_SUFFIX):
        raise TracePathError(f"{text!r} is an unfinished trace (Kineto is still writing it); fetch it once renamed")
    path = inside(root, text, "file")
    if not path.is_file():
        raise FileNotFoundError(f"no finished file {text!r} under the trace dir")
    return path
