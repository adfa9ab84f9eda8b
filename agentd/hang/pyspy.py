"""Stacks of one rank process through ``py-spy dump --json``.

py-spy reads the target's memory from outside (ptrace permission needed) and
pauses it only for the milliseconds the read takes. The binary comes from the
py-spy wheel, installed next to the agent's Python. A dump is bounded in time
and never attempted against a process in uninterruptible sleep (D state),
where ptrace itself would block.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

from agentd.procfs import DISK_SLEEP, GONE, state_of
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

log = logging.getLogger(__name__)

PYTHON_TIMEOUT_S = 10.0
NATIVE_TIMEOUT_S = 30.0
UNNAMED_THREAD = "unnamed thread"


class PySpyMissing(RuntimeError):
    """No py-spy binary next to the agent's Python nor on PATH."""


def find_pyspy() -> pathlib.Path:
    """The py-spy binary of the agent's environment (the wheel puts it next to python)."""
    beside = pathlib.Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return beside
    found = shutil.which("py-spy")
    if found:
        return pathlib.Path(found)
    raise PySpyMissing(
        f"py-spy not found next to {sys.executable} nor on PATH; "
        "install it into the agent's environment: pip install py-spy"
    )


def pyspy_version(binary: pathlib.Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def dump(binary: pathlib.Path, pid: int, rank: int | None, native: bool) -> pb.RankStacks:
    """All threads of ``pid``; on failure ``error`` says why (and threads stay empty)."""
    result = pb.RankStacks(pid=pid)
    if rank is not None:
        result.rank = rank
    state = state_of(pid)
    if state == DISK_SLEEP:
        result.error = "process is in D state (uninterruptible I/O wait): not dumped, ptrace would block"
        return result
    if state in (GONE, "zombie", "dead"):
        result.error = f"process is {state}: no stacks to take"
        return result
    if state in ("stopped", "tracing-stop"):
        result.error = (f"process is {state} (SIGSTOP or a debugger): py-spy cannot read a stopped "
                        f"process; resume it with kill -CONT {pid} to see its stack")
        return result
    started = time.monotonic()
    error = _run(binary, pid, native, result)
    if error and native:
        # Native unwinding is not supported everywhere; Python frames still are.
        fallback_error = _run(binary, pid, False, result)
        error = f"native frames unavailable ({error}); Python frames only" if not fallback_error else error
    result.dump_seconds = time.monotonic() - started
    if error:
        result.error = error
    return result


def _run(binary: pathlib.Path, pid: int, native: bool, result: pb.RankStacks) -> str | None:
    command = [str(binary), "dump", "--json", "--pid", str(pid)]
    if native:
        command.append("--native")
    timeout = NATIVE_TIMEOUT_S if native else PYTHON_TIMEOUT_S
    try:
        out = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"py-spy did not finish within {timeout:.0f} s"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        # py-spy prints "Error: <cause>" and then a Rust backtrace: the cause is the message.
        cause = next((line for line in lines if line.startswith("Error:")), lines[0] if lines else "no output")
        return f"py-spy failed (exit {out.returncode}): {printable(cause.removeprefix('Error:').strip())}"
    try:
        threads = json.loads(out.stdout)
    except json.JSONDecodeError as exc:
        return f"py-spy printed something that is not JSON: {exc}"
    del result.threads[:]
    for thread in threads:
        result.threads.append(thread_from_pyspy(thread))
    return None


def thread_from_pyspy(thread: dict[str, Any]) -> pb.ThreadStack:
    """One py-spy JSON thread as a ThreadStack (py-spy lists frames innermost first)."""
    out = pb.ThreadStack(
        thread_id=int(thread.get("os_thread_id") or thread.get("thread_id") or 0),
        # unnamed threads share one name (numbered "[2]"... per rank by merge) so they line up across ranks
        thread_name=printable(thread.get("thread_name") or UNNAMED_THREAD),
        active=bool(thread.get("active")),
    )
    for frame in reversed(thread.get("frames") or []):
        module = frame.get("module")
        out.frames.append(
            pb.Frame(
                function=printable(frame.get("name") or "??"),
                file=printable(frame.get("filename") or ""),
                line=int(frame.get("line") or 0),
                native=module is not None,
                module=printable(module or ""),
            )
        )
    return out
