"""PyTorch Flight Recorder progress, published beside the rank's segment for agentd.

Flight Recorder (on by default in recent PyTorch; ``TORCH_FR_BUFFER_SIZE=0``
turns it off) counts, per process group, the collectives a rank enqueued and
completed. A daemon thread reads those counters every ``POLL_S`` (microseconds: no entries are serialized) and, only
when a group has collectives enqueued and not completed and no counter moved
for ``ENTRIES_AFTER_S``, reads the entries once to name them (op, sequence
number, when enqueued): that dump serializes the recorder's whole ring (tens of
milliseconds for its default 2000 entries, see bench/hangs/hangs.md), so it waits for
a stall that a healthy step does not have. While collectives move it also
reads the entries at most once per ``ARRIVALS_EVERY_S``, without stack traces
(a few ms for 800 entries on one core, see bench/slowdown/README.md), to
publish when this rank enqueued its newest collectives ("recent"): the slowdown
verdict joins them across ranks to find the rank the others wait for. The file is rewritten only when what
it says changes. The thread needs the GIL for those moments only; a rank stuck
in a collective has released it. Any failure stops the thread quietly: telemetry never breaks
training.

File format (JSON): ``{"groups": [{"id": "0", "last_enqueued": 121,
"last_completed": 120}], "active": [{"pg": "0", "seq": 121, "op":
"gloo:all_reduce", "enqueued_ns": 1795...}], "recent": [{"pg": "0", "seq": 121,
"enqueued_ns": 1795...}]}`` (recent: the newest ``RECENT_PER_GROUP`` entries of each group).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

POLL_S = 0.5
ENTRIES_AFTER_S = 2.0
ARRIVALS_EVERY_S = 1.0
RECENT_PER_GROUP = 256
log = logging.getLogger("tuiprof.startup")

Dump = Callable[[bool, bool], bytes]  # torch._C._distributed_c10d._dump_fr_trace_json(collectives, only_active)
Entries = Callable[[], list[dict]]    # the recorder's entries, without stack traces where PyTorch can leave them out
Groups = dict[str, tuple[int, int]]   # group id -> (last enqueued, last completed)


class FlightPublisher:
    """Polls Flight Recorder and writes its progress to ``path`` with ``write`` (whole-file, atomic)."""

    def __init__(self, dump: Dump, entries: Entries, path: str, write: Callable[[str, str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dump = dump
        self._entries = entries
        self._path = path
        self._write = write
        self._clock = clock
        self._groups: Groups = {}
        self._still_since = clock()
        self._active: list[dict] | None = None
        self._retired: dict[str, int] = {}  # group -> its newest retired collective, from the same read
        self._written: dict | None = None
        self._recent: list[dict] = []
        self._recent_at = -ARRIVALS_EVERY_S

    def start(self) -> None:
        threading.Thread(target=self._run, name="tuiprof-flight", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                time.sleep(POLL_S)
                self.poll()
        except Exception:
            log.debug("tuiprof Flight Recorder publisher stopped", exc_info=True)

    def poll(self) -> None:
        status = json.loads(self._dump(False, True)).get("pg_status", {})
        groups = {str(pg): (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
                  for pg, s in status.items()}
        now = self._clock()
        if groups != self._groups:
            self._groups, self._active, self._retired, self._still_since = groups, None, {}, now
            if now - self._recent_at >= ARRIVALS_EVERY_S:
                self._recent, self._recent_at = _recent(self._read(groups)), now
        elif (self._active is None and now - self._still_since >= ENTRIES_AFTER_S
              and any(enqueued > completed for enqueued, completed in groups.values())):
            entries = self._read(groups)
            self._active, self._retired = _active(entries, groups), _retired(entries)
            self._recent = _recent(entries)
        # The recorder's "last completed" is whichever completion was recorded last: with several
        # worker threads (gloo's) an older one can land after a newer one (a 4-rank gloo job on a
        # loaded machine said 118 for good after 120). A group's collectives complete in order, so
        # its newest retired entry is a floor.
        doc = {"groups": [{"id": pg, "last_enqueued": max(e, 0), "last_completed": max(c, self._retired.get(pg, c), 0)}
                          for pg, (e, c) in sorted(groups.items())],
               "active": self._active or [], "recent": self._recent}
        if doc != self._written:
            self._write(self._path, json.dumps(doc))
            self._written = doc

    def _read(self, groups: Groups) -> list[dict]:
        """The recorder's collective entries of the known groups (point-to-point left out)."""
        return [e for e in self._entries() if not e.get("is_p2p") and str(e.get("pg_id")) in groups]


def _retired(entries: list[dict]) -> dict[str, int]:
    """Each group's newest completed ("retired") collective. Asked for active entries only, PyTorch 2.13
    still gives gloo's completed ones, all "scheduled"."""
    retired: dict[str, int] = {}
    for e in entries:
        if e.get("retired"):
            pg = str(e["pg_id"])
            retired[pg] = max(retired.get(pg, -1), int(e["collective_seq_id"]))
    return retired


def _active(entries: list[dict], groups: Groups) -> list[dict]:
    """The collectives enqueued and not completed, named."""
    return [{"pg": str(e["pg_id"]), "seq": int(e["collective_seq_id"]), "op": str(e["profiling_name"]),
             "enqueued_ns": int(e["time_created_ns"])}
            for e in entries
            if not e.get("retired") and int(e["collective_seq_id"]) > groups[str(e["pg_id"])][1]]


def _recent(entries: list[dict]) -> list[dict]:
    """When this rank enqueued each group's newest collectives (its arrivals)."""
    newest = sorted(entries, key=lambda e: (str(e["pg_id"]), int(e["collective_seq_id"])))
    recent: list[dict] = []
    for pg in sorted({str(e["pg_id"]) for e in newest}):
        group = [e for e in newest if str(e["pg_id"]) == pg][-RECENT_PER_GROUP:]
        recent += [{"pg": pg, "seq": int(e["collective_seq_id"]), "enqueued_ns": int(e["time_created_ns"])}
                   for e in group]
    return recent
