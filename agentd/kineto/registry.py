"""Which processes poll us, and the trace configs waiting for them.

Identified like dynolog (job id + the pid ancestry the process reports, as far as
/proc confirms it) plus the sender's pid as the kernel gives it (SO_PASSCRED). The
ancestry is kept in the agent's (host) pids, whatever pid namespace the process
lives in: two containers whose processes both call themselves pid 1 stay apart, and
callers name every process by the pid the host shows.
There is one entry per sending process: a poll from the same kernel pid with
another job or ancestry (pid reuse) replaces it, so a client making up pid
lists cannot grow the registry.
A config is handed out once, and only to a poll that asks for activities; one that names a
file of the caller's choosing only while the process still acts with exactly the rights it
had when the config was offered (``PendingConfig.acting_as``).
Entries that have not polled for ``keepalive_seconds`` are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.procfs import Credentials, ineligible_reason

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 60.0
# Bounds on what polling clients can make the agent keep: processes at once, and per user.
MAX_ENTRIES = 4096
MAX_ENTRIES_PER_UID = 1024


@dataclass
class PendingConfig:
    """A config waiting for one process's next activities poll."""

    text: str
    delivered_at: float | None = None  # time.time() when handed out
    # The credentials the process must still act with when it takes the config (None: any): its log file is
    # one the caller chose, written with the process's rights, which must stay its owner's and no more
    # (a set-user-ID exec between the offer and the poll keeps the pid and the real uid the kernel reports).
    acting_as: Credentials | None = None


@dataclass
class Registrant:
    job_id: str
    pids: tuple[int, ...]  # the believed ancestry in the agent's pid namespace: own pid first, then ancestors
    host_pid: int  # from the kernel (SO_PASSCRED), in the agent's pid namespace
    uid: int
    first_seen: float  # time.monotonic()
    last_seen: float
    # Its pid in its own pid namespace (getpid() in a container): libkineto names its trace file with it.
    pid_in_namespace: int
    profiler_busy: bool = False  # last poll did not ask for activities: a trace is running
    pending: PendingConfig | None = None
    poll_interval: float | None = None  # seconds between its last two polls

    @property
    def key(self) -> tuple[str, tuple[int, ...], int]:
        return (self.job_id, self.pids, self.host_pid)


class RegistryFullError(Exception):
    """A new process polls while the registry (or its user's share) is full; it is not registered."""


class BusyError(Exception):
    """The process already has a config waiting or is tracing right now."""


class Registry:
    """Thread-safe: the IPC thread polls, the gRPC side offers configs."""

    def __init__(self, keepalive_seconds: float = KEEPALIVE_SECONDS) -> None:
        self.keepalive_seconds = keepalive_seconds
        self._lock = threading.Lock()
        self._entries: dict[int, Registrant] = {}  # by kernel pid
        self._per_uid: dict[int, int] = {}
        self._limited = CauseLimitedLogger(log)

    def poll(
        self, job_id: int, pids: tuple[int, ...], host_pid: int, uid: int, wants_activities: bool,
        pid_in_namespace: int | None = None,
    ) -> PendingConfig | None:
        """Record a poll and return the config to send now, if one is due (RegistryFullError: a new
        process past the bounds). ``pids`` are host pids; ``pid_in_namespace`` is the sender's own
        pid where its pid namespace is not the agent's (None: the same as ``host_pid``)."""
        now = time.monotonic()
        own_pid = host_pid if pid_in_namespace is None else pid_in_namespace
        with self._lock:
            entry = self._entries.get(host_pid)
            if entry is None or entry.key != (str(job_id), pids, host_pid) or entry.uid != uid \
                    or entry.pid_in_namespace != own_pid:
                entry = self._register(Registrant(str(job_id), pids, host_pid, uid, now, now, own_pid),
                                       replaces=entry)
            else:
                entry.poll_interval = now - entry.last_seen
            entry.last_seen = now
            entry.profiler_busy = not wants_activities
            if not wants_activities or entry.pending is None:
                return None
            pending, entry.pending = entry.pending, None
        if pending.acting_as is not None:
            changed = ineligible_reason(host_pid, pending.acting_as)
            if changed:
                self._limited.warning("rights-changed", "trace config for pid %d withdrawn: %s", host_pid, changed)
                return None
        pending.delivered_at = time.time()
        return pending

    def _register(self, entry: Registrant, replaces: Registrant | None) -> Registrant:
        """Add ``entry`` (in place of ``replaces``, the same kernel pid) within the bounds (caller holds the lock)."""
        if replaces is not None:
            self._drop(replaces)
        elif len(self._entries) >= MAX_ENTRIES or self._per_uid.get(entry.uid, 0) >= MAX_ENTRIES_PER_UID:
            raise RegistryFullError(f"{len(self._entries)} processes poll already ({self._per_uid.get(entry.uid, 0)} "
                                    f"of uid {entry.uid}); at most {MAX_ENTRIES}, {MAX_ENTRIES_PER_UID} per user")
        self._entries[entry.host_pid] = entry
        self._per_uid[entry.uid] = self._per_uid.get(entry.uid, 0) + 1
        fields = {"pid": entry.host_pid, "job_id": entry.job_id[:32], "uid": entry.uid,
                  "ancestry": ",".join(map(str, entry.pids))}
        if entry.pid_in_namespace != entry.host_pid:
            fields["pid_in_namespace"] = entry.pid_in_namespace
        if replaces is None:
            log.info("Kineto client registered", extra=fields)
        else:  # a process that keeps changing its job or ancestry must not flood the log
            self._limited.info("re-registered", "Kineto client registered again (new job or ancestry)",
                               fields=fields)
        return entry

    def _drop(self, entry: Registrant) -> None:
        del self._entries[entry.host_pid]
        left = self._per_uid[entry.uid] - 1
        if left:
            self._per_uid[entry.uid] = left
        else:
            del self._per_uid[entry.uid]

    def undeliver(self, job_id: int, pids: tuple[int, ...], host_pid: int, config: PendingConfig) -> None:
        """Put back a config whose reply could not be sent, for the next poll."""
        with self._lock:
            entry = self._entries.get(host_pid)
            if entry is not None and entry.key == (str(job_id), pids, host_pid) and entry.pending is None:
                config.delivered_at = None
                entry.pending = config

    def offer(self, entry: Registrant, config: PendingConfig) -> None:
        """Queue ``config`` for the entry's next activities poll (while its profiler is busy
        tracing, polls do not ask for activities and the config waits); BusyError when one
        is already waiting or the process is gone."""
        with self._lock:
            current = self._current(entry)
            if current is None:
                raise BusyError("the process stopped polling")
            if current.pending is not None:
                raise BusyError("another trace config is already waiting for this process")
            current.pending = config

    def withdraw(self, entry: Registrant, config: PendingConfig) -> bool:
        """Take back a config not yet delivered; True when it was still waiting."""
        with self._lock:
            current = self._current(entry)
            if current is not None and current.pending is config:
                current.pending = None
                return True
            return False

    def is_registered(self, entry: Registrant) -> bool:
        with self._lock:
            return self._current(entry) is not None

    def _current(self, entry: Registrant) -> Registrant | None:
        """The live entry for the same process as ``entry`` (caller holds the lock)."""
        current = self._entries.get(entry.host_pid)
        return current if current is not None and current.key == entry.key else None

    def entries(self) -> list[Registrant]:
        with self._lock:
            return list(self._entries.values())

    def match(self, job_id: str, pids: set[int]) -> list[Registrant]:
        """Processes of ``job_id`` ("" = any) whose host pid or any believed ancestor's is in ``pids`` (empty = all).

        Leaf processes come first (an entry whose pid is some other entry's
        ancestor is a launcher), then by host pid.
        """
        with self._lock:
            found = [
                e
                for e in self._entries.values()
                if (not job_id or e.job_id == job_id)
                and (not pids or e.host_pid in pids or not pids.isdisjoint(e.pids))
            ]
            ancestors = {pid for e in self._entries.values() for pid in e.pids[1:]}
        return sorted(found, key=lambda e: (e.host_pid in ancestors, e.host_pid))

    def expire(self) -> list[Registrant]:
        """Drop entries silent for longer than the keepalive; returns them."""
        cutoff = time.monotonic() - self.keepalive_seconds
        with self._lock:
            gone = [e for e in self._entries.values() if e.last_seen < cutoff]
            for entry in gone:
                self._drop(entry)
        return gone
