"""A polling process's pid ancestry as the kernel sees it, to check the one libkineto reports.

libkineto sends its own pid, then its parent's, grandparent's, ... (at most 11,
stopping before pid 1), each as its own pid namespace numbers them: inside a
container, the container's pids. Those are claims: a process could name another
user's launcher as its ancestor to join that user's captures. The agent walks the
real chain in /proc from the sender's kernel pid (SCM_CREDENTIALS, already in the
agent's pid namespace) and maps each ancestor into the sender's pid namespace
(``NSpid:``); only the part of the claim that agrees is believed, and it is kept
as the agent's (host) pids of the same processes, so that ``tuiprof trace --pids``
and ``dyno gputrace --pids`` name containerised processes by the pids the host shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.procfs import read_whole

MAX_ANCESTRY = 11  # libkineto's own pid and at most 10 parents (kMaxParentPids)


@dataclass(frozen=True)
class Ancestry:
    """One process's chain, own pid first: ``seen`` as its pid namespace numbers each process (what
    libkineto reports), ``host`` the same processes as the agent numbers them."""

    seen: tuple[int, ...]
    host: tuple[int, ...]

    def believed(self, claimed: tuple[int, ...]) -> tuple[int, ...]:
        """The host pids of the leading part of ``claimed`` that agrees with ``seen`` (empty: not
        even its own pid).

        libkineto works its list out once, at start: an ancestor that exited since
        leaves the process re-parented, and the rest of its old claim is no longer
        provable, so it is dropped rather than believed."""
        agreed = 0
        for claim, fact in zip(claimed, self.seen, strict=False):  # the prefix both have: either may be longer
            if claim != fact:
                break
            agreed += 1
        return self.host[:agreed]


def _status_fields(pid: int) -> tuple[int, tuple[int, ...]] | None:
    """(PPid, NSpid levels outermost first) of ``pid`` in the agent's namespace, None when gone."""
    try:
        raw = read_whole(f"/proc/{pid}/status")
    except OSError:
        return None
    ppid, nspid = None, None
    for line in raw.split(b"\n"):
        if line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"NSpid:"):
            nspid = tuple(int(field) for field in line.split()[1:])
    if ppid is None or not nspid:
        return None
    return ppid, nspid


def real_ancestry(host_pid: int) -> Ancestry | None:
    """``host_pid``'s chain as libkineto inside it would report it now, with each process's host
    pid beside it; None when the process is gone."""
    own = _status_fields(host_pid)
    if own is None:
        return None
    depth = len(own[1])  # the sender's pid namespace is this many levels below ours
    seen, host = [own[1][-1]], [own[1][0]]
    ppid = own[0]
    while ppid > 0 and len(seen) < MAX_ANCESTRY:
        parent = _status_fields(ppid)
        if parent is None or len(parent[1]) < depth:
            break  # gone, or outside the sender's pid namespace (it sees its parent as 0)
        seen_as = parent[1][depth - 1]
        if seen_as <= 1:
            break  # libkineto stops before its namespace's init
        seen.append(seen_as)
        host.append(parent[1][0])
        ppid = parent[0]
    return Ancestry(tuple(seen), tuple(host))
