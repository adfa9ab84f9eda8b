"""How a rank ended, from what its process left behind (the agent is not its parent).

The hook library notes in the segment header the status the process passed to
exit() and the last fatal signal it received (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
SIGABRT, SIGTERM); the Python startup hook writes the last uncaught
exception's traceback to a file beside the segment (read with ``rank_files``).
What none of them can see — SIGKILL, os._exit — is reported as unavailable,
with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.proto import tuiprof_agent_pb2 as pb

if TYPE_CHECKING:  # the header's type only: the caller reads it
    from tuiprof_native import segment as native


def fill_exit_status(header: native.Header, stats: pb.RankStats, flag_exited: int) -> None:
    """``exit_code`` or ``exit_signal`` of an exited rank, or both unavailable with the reason."""
    if header.exit_status is not None:
        stats.exit_code = header.exit_status
        return
    ran_exit_handlers = bool(header.flags & flag_exited)
    if header.fatal_signal is not None and not ran_exit_handlers:
        stats.exit_signal = header.fatal_signal
        return
    if ran_exit_handlers:
        why = "the process ran its exit handlers but its exit status was not recorded"
    else:
        why = ("the process neither called exit() nor received a fatal signal it could note: "
               "killed by SIGKILL (e.g. the OOM killer) or left through os._exit")
    fill_exit_unknown(stats, f"{why}; only its parent learns the status")


def fill_exit_unknown(stats: pb.RankStats, reason: str) -> None:
    """Neither ``exit_code`` nor ``exit_signal`` can be told, for ``reason``."""
    stats.unavailable["exit_code"] = reason
    stats.unavailable["exit_signal"] = reason
