"""The on-demand config text libkineto parses (``KEY=value`` lines; see research/dynolog.md §2).

Activity types must be named explicitly: with none, a CPU-only PyTorch build
records no op events at all. An unknown type name makes libkineto abandon the
whole config, so only long-standing names are used, and GPU ones only for
processes that have CUDA loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_ACTIVITIES = ("cpu_op", "user_annotation", "cpu_instant_event")
GPU_ACTIVITIES = ("gpu_user_annotation", "gpu_memcpy", "gpu_memset", "kernel", "cuda_runtime", "cuda_driver")
STACK_ACTIVITIES = ("python_function",)
# How often libkineto asks the daemon for a config (its on-demand update interval, unless the
# base config sets ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS); a process registers on its first ask.
DEFAULT_POLL_SECONDS = 5.0
# Seconds libkineto spends warming up before the start time; the start time must
# leave at least this much after the process picks the config up.
WARMUP_SECONDS = 1
# Steps libkineto warms up before the first traced iteration.
WARMUP_ITERATIONS = 2


class ConfigValueError(ValueError):
    """A value that would break the config's one-``KEY=value``-per-line form (a newline, a control character)."""


@dataclass(frozen=True)
class TraceSpec:
    """What to record; exactly one of duration_ms / iterations is set."""

    log_file: str
    start_time_unix_ms: int
    duration_ms: int | None = None
    iterations: int | None = None
    # The iteration (optimizer steps since the process started) to trace from; 0: the
    # process's next step after it takes the config (libkineto moves a start in the past there).
    start_iteration: int = 0
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False


def _flag(value: bool) -> str:
    return "true" if value else "false"


def activity_types(cuda: bool, with_stack: bool) -> tuple[str, ...]:
    return CPU_ACTIVITIES + (GPU_ACTIVITIES if cuda else ()) + (STACK_ACTIVITIES if with_stack else ())


def config_text(spec: TraceSpec, cuda: bool, trace_id: str) -> str:
    """The config for one process. ``trace_id`` ends up in the trace's metadata."""
    lines = [f"ACTIVITIES_LOG_FILE={spec.log_file}",
             f"ACTIVITY_TYPES={','.join(activity_types(cuda, spec.with_stack))}"]
    if spec.iterations is not None:
        lines += [f"PROFILE_START_ITERATION={spec.start_iteration}", "PROFILE_START_ITERATION_ROUNDUP=1",
                  f"ACTIVITIES_WARMUP_ITERATIONS={WARMUP_ITERATIONS}", f"ACTIVITIES_ITERATIONS={spec.iterations}"]
    else:
        assert spec.duration_ms is not None
        lines += [f"PROFILE_START_TIME={spec.start_time_unix_ms}", f"ACTIVITIES_DURATION_MSECS={spec.duration_ms}",
                  f"ACTIVITIES_WARMUP_PERIOD_SECS={WARMUP_SECONDS}"]
    lines += [
        f"PROFILE_REPORT_INPUT_SHAPES={_flag(spec.record_shapes)}",
        # Memory events in the trace; not PROFILE_MEMORY, whose snapshot file
        # would land in /tmp, outside the trace dir.
        f"PROFILE_PROFILE_MEMORY={_flag(spec.profile_memory)}",
        f"PROFILE_WITH_STACK={_flag(spec.with_stack)}",
        f"PROFILE_WITH_FLOPS={_flag(spec.with_flops)}",
        f"PROFILE_WITH_MODULES={_flag(spec.with_modules)}",
        f"REQUEST_TRACE_ID={trace_id}",
    ]
    for line in lines:
        check_line(line)
    return "\n".join(lines) + "\n"


def check_line(line: str) -> None:
    """Every line is one ``KEY=value`` with nothing libkineto would read as a second line or key."""
    key, _, value = line.partition("=")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in line) or "=" in value:
        raise ConfigValueError(f"the config value of {key} holds a control character or '=': {value[:80]!r}")


def kineto_file_name(log_file: str, pid_in_namespace: int) -> str:
    """The name libkineto actually writes: it inserts ``_<pid>`` (the pid in the
    process's own namespace) before ``.pt.trace.json``, else before the first ``.json``."""
    for marker in (".pt.trace.json", ".json"):
        if marker in log_file:
            return log_file.replace(marker, f"_{pid_in_namespace}{marker}", 1)
    return log_file
