"""What a rank's telemetry can be trusted for: the hook library's health and Flight Recorder progress as sentences.

Pure functions over the model's ``RankStats``; the host view's rank detail line
shows them above the readings the agent could not take.
"""

from __future__ import annotations

from tuiprof.model.messages import HookHealth, RankStats


def telemetry_off(rank: RankStats) -> str | None:
    """``telemetry off: <why>`` when the hook library is loaded but inert in this process, else None."""
    reason = rank.hook.inactive_reason
    return f"telemetry off: {reason}" if reason else None


def hook_reasons(hook: HookHealth) -> list[str]:
    """Why some GEMM/NCCL figures are missing or partial, one sentence per cause (none when all is well);
    first, when the user had named another NCCL profiler plugin, whether the hook passes it NCCL's events."""
    if hook.inactive_reason:
        return [f"telemetry off: {hook.inactive_reason}"]
    lines = [f"NCCL profiler plugin {hook.nccl_profiler_chain}"] if hook.nccl_profiler_chain else []
    if hook.gemm_untimed_total:
        cause = "no CUDA event free" if hook.cuda_timing else "no CUDA events"
        lines.append(f"{hook.gemm_untimed_total} GEMMs counted but not timed: {cause}")
    lines += _nccl_api_reasons(hook)
    if hook.nccl_untimed_total and (hook.nccl_api_events or not hook.nccl_api_fallback):
        if hook.nccl_api_events:
            cause = ": no CUDA event free" if hook.cuda_timing else ": no CUDA events"
        else:
            cause = "" if hook.nccl_gpu_timers else ": NCCL sent no GPU timer events"
        lines.append(f"{hook.nccl_untimed_total} collectives finished without GPU timestamps{cause}")
    if hook.dropped_records_total:
        lines.append(f"{hook.dropped_records_total} records dropped: ring full")
    if hook.slot_overflow_total:
        lines.append(f"{hook.slot_overflow_total} records folded into the overflow slot: too many op kinds")
    if hook.nccl_channel_shortfall_total:
        lines.append(f"{hook.nccl_channel_shortfall_total} collectives finished with fewer kernel channels "
                     "than announced")
    if hook.nccl_late_channels_total:
        lines.append(f"{hook.nccl_late_channels_total} kernel-channel events came after their collective finished")
    return lines


def _nccl_api_reasons(hook: HookHealth) -> list[str]:
    """What the NCCL figures are when NCCL did not take the profiler plugin (the hook's API fallback)."""
    if not hook.nccl_api_fallback:
        return []
    if hook.nccl_api_events:
        return ["NCCL did not take the profiler plugin: collectives timed by CUDA events on their stream "
                "(from the op's turn on the stream to its end, launch gaps included; not kernel time)"]
    return ["NCCL did not take the profiler plugin: collectives counted at its API, not timed "
            "(`tuiprof run --nccl-fallback` times them on their stream)"]


def flight_recorder(rank: RankStats) -> str | None:
    """``Flight Recorder: pg 0 enqueued 12 completed 11 · …``; None when PyTorch's Flight Recorder is off."""
    if not rank.process_groups:
        return None
    groups = [f"pg {g.id} enqueued {g.last_enqueued} completed {g.last_completed}"
              + (f" ({g.last_enqueued - g.last_completed} pending)" if g.last_enqueued > g.last_completed else "")
              for g in rank.process_groups]
    return "Flight Recorder: " + " · ".join(groups)


def function_timing(rank: RankStats) -> list[str]:
    """The last run-time request to start or stop timing functions (the ranks tab's `f`) and what came of
    it, and the functions waiting for their module's import."""
    lines = []
    request = rank.function_request
    if request.serial:  # 0: no request since the agent found the rank
        if not request.acknowledged:
            lines.append(f"function timing request not applied yet: {request.reason}")
        else:
            lines += [f"function timing request: {problem}" for problem in request.problems] or [
                "function timing request: applied"]
    if rank.functions_waiting:
        lines.append(f"functions timed once their module is imported: {', '.join(rank.functions_waiting)}")
    return lines


def rank_notes(rank: RankStats) -> list[str]:
    """The rank's detail lines: hook health first, then its Flight Recorder progress, then function timing."""
    progress = flight_recorder(rank)
    return hook_reasons(rank.hook) + ([progress] if progress else []) + function_timing(rank)
