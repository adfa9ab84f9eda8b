"""Where `pip install .` spends its time: each phase of pip's build, for one or more source trees.

    python bench/native/install_time.py [--rev REV ...] [--with-deps]

Each tree (the working tree, or ``git archive REV``) is installed into a fresh venv
with ``pip install . --no-deps -v`` (``--with-deps``: also once with its dependencies,
from whatever index and cache pip is configured with). pip's verbose lines are
time-stamped as they arrive; the phases are the spans between its own markers.
Wall time depends on what else runs; CPU time (user + sys of every child) much less,
so both are printed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
# (phase, a line pip or setuptools prints when it starts), in the order they come
MARKERS = [
    ("build deps (setuptools, cython) into the isolated env", "Installing build dependencies: started"),
    ("get requires (runs setup.py: cythonize)", "Getting requirements to build wheel: started"),
    ("metadata", "Preparing metadata (pyproject.toml): started"),
    ("resolve and fetch the dependencies", "Collecting "),
    ("build: copy sources", "Building wheel for tuiprof"),
    ("build: compile the Cython modules", "-c tuiprof_native/"),
    ("build: compile and link the hook library", "-c tuiprof_native/hook/"),
    ("wheel", "creating build/bdist"),
    ("install (unpack wheels, byte-compile)", "Installing collected packages"),
]


def source_tree(rev: str | None, into: pathlib.Path) -> pathlib.Path:
    if rev is None:
        return REPO
    tree = into / "src"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def install(tree: pathlib.Path, work: pathlib.Path, deps: bool) -> tuple[float, float, list[tuple[float, str]]]:
    """(wall s, CPU s, time-stamped verbose lines) of one install into a fresh venv."""
    venv = work / ("venv-deps" if deps else "venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    command = [str(venv / "bin" / "pip"), "install", ".", "-v"] + ([] if deps else ["--no-deps"])
    cpu, start = children_cpu(), time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            lines.append((time.monotonic() - start, line.rstrip()))
    if pip.returncode != 0:
        sys.exit("\n".join(text for _, text in lines[-30:]))
    return time.monotonic() - start, children_cpu() - cpu, lines


def phases(lines: list[tuple[float, str]], total: float) -> list[tuple[str, float]]:
    """Seconds per phase: each marker is looked for after the previous one found."""
    starts: list[tuple[str, float]] = []
    position = 0
    for name, marker in MARKERS:
        found = next((i for i in range(position, len(lines)) if marker in lines[i][1]), None)
        if found is not None:
            starts.append((name, lines[found][0]))
            position = found + 1
    ends = [at for _, at in starts[1:]] + [total]
    return [("pip start-up", starts[0][1] if starts else total)] + [
        (name, end - at) for (name, at), end in zip(starts, ends, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", action="append", default=[], help="a git revision to install (default: the working tree)")
    parser.add_argument("--with-deps", action="store_true", help="also install each tree with its dependencies")
    args = parser.parse_args()
    print(f"host: {os.uname().nodename}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    for rev in args.rev or [None]:
        with tempfile.TemporaryDirectory(prefix="tuiprof-install-") as folder:
            work = pathlib.Path(folder)
            tree = source_tree(rev, work)
            for deps in ([False, True] if args.with_deps else [False]):
                wall, cpu, lines = install(tree, work, deps)
                label = f"{rev or 'working tree'}, {'with' if deps else 'without'} dependencies"
                print(f"\n{label}: {wall:.1f} s wall, {cpu:.1f} s CPU "
                      f"(load average now {os.getloadavg()[0]:.1f})")
                for name, seconds in phases(lines, wall):
                    print(f"  {seconds:6.1f} s  {name}")


if __name__ == "__main__":
    main()
