"""Who holds an abstract unix socket name: its inode from /proc/net/unix, then the process with it open.

The agent binds ``@dynolog@`` once at start; a local user who bound it first
(while the agent was down) takes every trainer's polls. The agent names that
holder (pid and uid) in its log and in the kineto collector's reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentd.procfs import read_whole, real_uid
from agentd.text import user_label


@dataclass(frozen=True)
class Holder:
    pid: int
    uid: int | None
    command: str

    def __str__(self) -> str:
        who = "an unknown user" if self.uid is None else user_label(self.uid)
        return f"pid {self.pid} ({self.command!r}) of {who}"


def socket_inodes(abstract_name: bytes) -> set[int]:
    """Inodes of the sockets bound to ``abstract_name`` (leading NUL included) in this network namespace."""
    shown = "@" + abstract_name[1:].decode("ascii", "replace").replace("\0", "@")
    inodes = set()
    for line in read_whole("/proc/net/unix").decode("ascii", "replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == shown:
            inodes.add(int(fields[6]))
    return inodes


def holders(abstract_name: bytes) -> list[Holder]:
    """The processes that have a socket bound to ``abstract_name`` open (empty: none found)."""
    inodes = socket_inodes(abstract_name)
    if not inodes:
        return []
    targets = {f"socket:[{inode}]" for inode in inodes}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(_link(f"/proc/{entry}/fd/{fd}") in targets for fd in fds):
                command = read_whole(f"/proc/{entry}/comm").decode("utf-8", "replace").strip()
                found.append(Holder(int(entry), real_uid(int(entry)), command))
        except OSError:  # exited while looked at
            continue
    return found


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def describe_holders(abstract_name: bytes) -> str:
    """One phrase naming who holds ``abstract_name``, for a log line or a collector's reason."""
    try:
        found = holders(abstract_name)
    except OSError as exc:
        return f"its holder cannot be found ({exc.strerror})"
    if not found:
        return "no process with it open was found (it may be in another pid namespace)"
    return "held by " + ", ".join(str(holder) for holder in found)
