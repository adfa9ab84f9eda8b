"""The nodes of a SLURM job, for ``--slurm-job``.

Asks SLURM's own client tools (``squeue``, ``scontrol show hostnames``) rather
than libslurm or slurmrestd: they are on every login node, follow the user's
``SLURM_CONF`` and need no credentials beyond munge. Node names are returned as
they are; the console connects to them as host names (DNS or /etc/hosts maps
them to addresses, as for ``ssh NODE``).
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from tuiprof.errors import BadInputError

log = logging.getLogger(__name__)

# States in which a job holds its nodes: its processes may still be there to watch
# (a job stuck COMPLETING is often the hung job one wants to look at).
ACTIVE_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})
DEFAULT_TIMEOUT_S = 30.0

# 4242, an array task 4242_7, or a heterogeneous job component 4242+1.
_JOB_ID = re.compile(r"\d+(_\d+|\+\d+)?")
_SQUEUE_FORMAT = "%T|%r|%N"
_CHECK_CONTROLLER = (
    "check that slurmctld is up (`scontrol ping`) and that SLURM_CONF names this cluster's slurm.conf"
)


class SlurmError(BadInputError):
    """SLURM could not say which nodes a job runs on; the message says why and what to do."""


class SlurmNotInstalledError(SlurmError):
    """The SLURM client tools are not on PATH."""


class BadJobIdError(SlurmError):
    """The job id is not of a form SLURM accepts."""


class UnknownJobError(SlurmError):
    """SLURM does not know the job (wrong id, other cluster, or finished long ago)."""


class JobNotRunningError(SlurmError):
    """The job exists but holds no nodes now (pending, completed, failed, ...)."""

    def __init__(self, message: str, states: tuple[str, ...]) -> None:
        super().__init__(message)
        self.states = states


class SlurmCommandError(SlurmError):
    """A SLURM tool failed or did not answer (controller down, bad configuration)."""


@dataclass(frozen=True)
class JobRow:
    """One line of ``squeue``: a job, or one task/component of an array or heterogeneous job."""

    state: str
    reason: str
    nodelist: str


def check_job_id(text: str) -> str:
    """``text`` stripped, if it is a job id squeue accepts."""
    job_id = text.strip()
    if not _JOB_ID.fullmatch(job_id):
        raise BadJobIdError(
            f"bad SLURM job id {text!r}: expected a number such as 4242 "
            "(4242_7 for an array task, 4242+1 for a heterogeneous job component)"
        )
    return job_id


def parse_squeue(output: str) -> list[JobRow]:
    """Rows of ``squeue -h -o '%T|%r|%N'`` output."""
    rows = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0]:
            raise SlurmCommandError(f"unexpected squeue output line {line!r} (expected STATE|REASON|NODELIST)")
        rows.append(JobRow(*fields))
    return rows


def active_nodelists(job_id: str, rows: list[JobRow]) -> list[str]:
    """The node lists of the rows that hold nodes now; an error saying why when none do."""
    if not rows:
        raise _unknown_job(job_id, "squeue lists no such job")
    nodelists = [row.nodelist for row in rows if row.state in ACTIVE_STATES and row.nodelist]
    if nodelists:
        return nodelists
    states = tuple(dict.fromkeys(row.state for row in rows))
    described = ", ".join(_describe_state(row) for row in rows[:3]) + (", ..." if len(rows) > 3 else "")
    if "PENDING" in states:
        advice = f"wait until `squeue -j {job_id}` shows it RUNNING"
    else:
        advice = "pick a running job (`squeue -t running`)"
    raise JobNotRunningError(
        f"SLURM job {job_id} is not running ({described}), so it has no nodes to watch; {advice}",
        states,
    )


def parse_hostnames(output: str) -> list[str]:
    """Host names printed one per line by ``scontrol show hostnames``, without repeats."""
    return list(dict.fromkeys(line.strip() for line in output.splitlines() if line.strip()))


def hosts_for_job(job_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The names of the nodes the job runs on now, in SLURM's order.

    Each SLURM tool gets at most ``timeout_s`` seconds: squeue retries for a long
    time when the controller is down or the configuration is missing.
    """
    job_id = check_job_id(job_id)
    squeue_argv = ["squeue", "-j", job_id, "-t", "all", "-h", "-o", _SQUEUE_FORMAT]
    squeue = _run_tool(squeue_argv, timeout_s)
    if squeue.returncode != 0:
        if "Invalid job id" in squeue.stderr:
            raise _unknown_job(job_id, f"squeue: {squeue.stderr.strip()}")
        raise _failed(squeue_argv, squeue, _CHECK_CONTROLLER)
    nodelists = active_nodelists(job_id, parse_squeue(squeue.stdout))
    scontrol_argv = ["scontrol", "show", "hostnames", ",".join(nodelists)]
    scontrol = _run_tool(scontrol_argv, timeout_s)
    if scontrol.returncode != 0:
        raise _failed(scontrol_argv, scontrol, "SLURM printed a node list it cannot expand")
    hosts = parse_hostnames(scontrol.stdout)
    if not hosts:
        raise SlurmCommandError(f"`{shlex.join(scontrol_argv)}` printed no host names")
    log.info("slurm job resolved", extra={"job_id": job_id, "hosts": hosts})
    return hosts


def _run_tool(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    path = shutil.which(argv[0])
    if path is None:
        raise SlurmNotInstalledError(
            f"finding a job's nodes needs SLURM's client tools, but `{argv[0]}` is not on PATH; "
            "run tuiprof on a node of the cluster (a login node), install the tools "
            "(Debian/Ubuntu: `apt install slurm-client`), or name the hosts: `tuiprof connect HOST ...`"
        )
    log.debug("running slurm tool", extra={"argv": argv})
    try:
        return subprocess.run(
            [path, *argv[1:]], capture_output=True, text=True, errors="replace",
            timeout=timeout_s, stdin=subprocess.DEVNULL, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = _text(exc.stderr).strip()
        raise SlurmCommandError(
            f"`{shlex.join(argv)}` did not answer within {timeout_s:g} s"
            + (f" ({stderr})" if stderr else "")
            + f"; {_CHECK_CONTROLLER}"
        ) from None
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {path}: {exc.strerror}") from None


def _failed(argv: list[str], result: subprocess.CompletedProcess[str], advice: str) -> SlurmCommandError:
    return SlurmCommandError(
        f"`{shlex.join(argv)}` failed (exit {result.returncode}): "
        f"{result.stderr.strip() or 'no message'}; {advice}"
    )


def _unknown_job(job_id: str, detail: str) -> UnknownJobError:
    return UnknownJobError(
        f"SLURM does not know job {job_id} ({detail}); check the id with `squeue -u $USER`: "
        "a job that ended more than MinJobAge ago, or one of another cluster, is not listed"
    )


def _describe_state(row: JobRow) -> str:
    if row.reason and row.reason not in ("None", "(null)"):
        return f"{row.state}, reason {row.reason}"
    return row.state


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
