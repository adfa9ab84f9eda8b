"""Helpers for the native tests (importable as ``native.support``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TypeVar

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import open_channel
from tuiprof_native import segment

HOOK = pathlib.Path(segment.__file__).parent / "libtuiprof_hook.so"
STANDINS = pathlib.Path(__file__).parent / "standins"
T = TypeVar("T")


def gcc(*args: str) -> None:
    subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", *args], check=True, capture_output=True, text=True)


def build_cuda_standins(out: pathlib.Path) -> None:
    """The stand-in CUDA driver (libcuda.so.1) and runtime (libcudart.so, over it) into ``out``."""
    gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so.1"), str(STANDINS / "cuda.c"))
    gcc("-shared", "-fPIC", "-o", str(out / "libcudart.so"), str(STANDINS / "cudart.c"), str(out / "libcuda.so.1"),
        "-Wl,-rpath,$ORIGIN")


def tuiprof_run_argv(*command: str, options: tuple[str, ...] = ()) -> list[str]:
    """`tuiprof run --no-kineto-daemon [OPTIONS] -- COMMAND` (no agentd here to poll) as an argv."""
    return [sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", *options, "--", *command]


def tuiprof_run(*command: str, options: tuple[str, ...] = (), launcher: tuple[str, ...] = (),
                **popen) -> subprocess.Popen:
    """Start `tuiprof run --no-kineto-daemon [OPTIONS] -- COMMAND`; it execs COMMAND, so the pid is COMMAND's.
    ``launcher``: an argv that runs first in that process and execs tuiprof's (given as its arguments)."""
    env = dict(os.environ)
    env.pop("KINETO_USE_DAEMON", None)
    env.pop("TUIPROF_GEMM_SAMPLE_EVERY", None)
    env.update(popen.pop("env", {}))
    return subprocess.Popen([*launcher, *tuiprof_run_argv(*command, options=options)], env=env, text=True, **popen)


@contextlib.contextmanager
def stand_in_rank(standins: pathlib.Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """The stand-in driver under `tuiprof run`, stopped at READY with its ops done and its segment live,
    until the block ends (then it finishes and its segment goes)."""
    process = tuiprof_run(str(standins / "driver"), str(standins / "libworkload.so"), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, env=env or {})
    try:
        json.loads(process.stdout.readline())
        assert process.stdout.readline().strip() == "READY"
        yield process
    finally:
        process.communicate("\n", timeout=10)
        remove_rank_files(process.pid)


def rank_files(pid: int) -> list[pathlib.Path]:
    """This user's files of ``pid`` in the segment directory: tuiprof-<uid>-<pid>-<random>[suffix]."""
    return sorted(pathlib.Path(segment.SEGMENT_DIR).glob(f"{segment.SEGMENT_PREFIX}{os.getuid()}-{pid}-*"))


def segment_path(pid: int) -> pathlib.Path:
    """The segment of ``pid`` (its hook draws the name's random part); while it has none, a path
    that does not exist."""
    found = [path for path in rank_files(pid) if (parsed := segment.parse_name(path.name)) and not parsed[2]]
    assert len(found) <= 1, f"pid {pid} has {len(found)} segments: {found}"
    return found[0] if found else pathlib.Path(segment.SEGMENT_DIR) / f"tuiprof-{os.getuid()}-{pid}-none"


def inert_note_paths(pid: int) -> list[pathlib.Path]:
    """The notes an inert hook in ``pid`` left (each under a random stem of its own)."""
    return [path for path in rank_files(pid) if path.name.endswith(segment.INERT_SUFFIX)]


def remove_rank_files(pid: int) -> None:
    for path in rank_files(pid):
        path.unlink(missing_ok=True)


def wait_for(predicate: Callable[[], T], timeout: float = 10.0) -> T:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


async def watch_rank(agent, pid: int, predicate: Callable[[pb.RankStats], bool],
                     timeout: float = 20.0) -> pb.RankStats:
    """The first RankStats of ``pid`` in the agent's Watch stream that satisfies ``predicate``."""
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        async for snapshot in call:
            ranks = [r for r in snapshot.ranks if r.pid == pid]
            if ranks and predicate(ranks[0]):
                call.cancel()
                return ranks[0]
    raise AssertionError(f"no matching RankStats for pid {pid}")


async def watch_snapshot(agent, predicate: Callable[[pb.HostSnapshot], bool],
                         timeout: float = 20.0) -> pb.HostSnapshot:
    """The first snapshot in the agent's Watch stream that satisfies ``predicate``."""
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        async for snapshot in call:
            if predicate(snapshot):
                call.cancel()
                return snapshot
    raise AssertionError("no matching snapshot")


# Python source that a test script run inside `unshare --mount --fork` starts with: a 64 KiB
# tmpfs on /dev/shm, filled to the last byte when the script's first argument is "fill".
SMALL_SHM_SETUP = """
import os, subprocess, sys
inodes = 64
options = "size=64k" + (f",nr_inodes={inodes}" if sys.argv[1] == "no-inode" else "")
subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", "/dev/shm"], check=True)
if sys.argv[1] == "fill":
    fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        os.close(fd)
elif sys.argv[1] == "no-inode":  # every inode taken by empty files
    try:
        for n in range(inodes):
            os.close(os.open(f"/dev/shm/filler{n}", os.O_WRONLY | os.O_CREAT))
    except OSError:
        pass
"""
