"""The ranks collector's cost with containers' /dev/shm folders full of ranks, against the same ranks in one folder.

Issue 28's budget: a root agent whose ranks collector looks into every mount namespace's /dev/shm
(``agentd.collectors.rank_places``) stays under 5 % of a core at a 1 s interval with 200 containers
holding 8 ranks each. Two phases, one after the other, each with ``--containers`` × ``--ranks``
rank segments of ``--ops`` GEMM ops (tests/testkit/op_segments.py: ``PUBLISH`` starts ``sleep``s and
writes a valid segment claiming each, its pid and start time patched into a real segment's header):

- ``containers``: each group of ranks in a container of its own (``unshare --pid --fork --mount``,
  /proc and a private 64 MiB tmpfs /dev/shm mounted inside; PUBLISH runs there as the container's pid 1,
  so the names and headers carry the pids the sleepers see themselves, 2..9, as a real hook writes
  them). The bench process (root, the host's namespaces) runs ``RanksCollector(1.0)``: no directory,
  so the container discovery is on (a /proc scan every ``SCAN_SECONDS``, one open /dev/shm per
  namespace).
- ``one-folder``: the same segments, written by host-pid sleepers into one private folder on the
  host's /dev/shm tmpfs (each group's PUBLISH in a mount namespace whose /dev/shm is that folder,
  bind-mounted), read by ``RanksCollector(1.0, directory=<folder>)``: the host-only path, no /proc scan.

Each group's ranks run as a uid of their own (``FIRST_UID`` + group; ``--one-owner``: all as root, as
most containers without a user namespace do), so the collector's per-owner file cap
(``rank_claims.MAX_FILES_PER_OWNER``) applies per group as it would per tenant.

In each phase ``collect()`` + ``fill()`` run once a second for ``--seconds`` (after the first, cold
interval, which opens and verifies every segment), timed with ``time.process_time`` (the process does
nothing else meanwhile). Every interval's snapshot must hold every sleeper, as the host sees it (host pid,
and in containers the pid inside, from /proc's NSpid), running: the bench stops with the collector's
refusals otherwise (other jobs' ranks on this host are counted, not checked). Intervals that listed /proc (``SegmentFolders`` rescanned) are reported
apart from the others.

    .venv/bin/python bench/containers/ranks_cost.py --containers 200 --ranks 8 --seconds 60

Prints a markdown table (bench/containers/README.md); ``--profile FILE`` profiles the containers phase's
measured intervals (cProfile: the stats written to FILE, the costliest functions printed). Needs root, util-linux
(unshare, setpriv). Every namespace and process it made is killed at the end (by mount namespace).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import os
import pathlib
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from agentd.collectors.ranks import RanksCollector  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from native.segment_forge import recorded_segment  # noqa: E402
from testkit.namespaces import NEEDED_BY_OTHERS, kill_namespace, traversal_view  # noqa: E402
from testkit.op_segments import PUBLISH, check_ops, with_ops  # noqa: E402

FIRST_UID = 20000  # group g's ranks run as uid FIRST_UID + g (no account needed: setpriv sets the ids)
CONTAINER_SHM = "64m"  # Docker's default --shm-size; a segment's written part is its header and slot table
PUBLISHERS_STARTING = 16  # groups started at once: 200 Python start-ups at a time swamp a small machine
INTERVAL_SECONDS = 1.0
PROFILE_LINES = 40  # functions printed per order


@dataclasses.dataclass
class Group:
    """One group of ranks: an unshare holding its mount namespace, PUBLISH and its sleepers."""

    process: subprocess.Popen[bytes]  # unshare (PUBLISH itself without --fork); closing its stdin ends the sleepers
    mount_namespace: int


def group_command(folder: pathlib.Path | None, uid: int, prefix_file: pathlib.Path, ranks: int) -> list[str]:
    """unshare running PUBLISH as ``uid`` in a container (its own pid namespace, /proc and /dev/shm) or, given
    a ``folder``, in a mount namespace of its own whose /dev/shm is that folder (host pids)."""
    if folder is None:
        setup = ["mount -t proc proc /proc", f"mount -t tmpfs -o size={CONTAINER_SHM},mode=1777 tmpfs /dev/shm"]
        namespaces = ["--pid", "--fork", "--mount"]
    else:
        setup = [f"mount --bind {shlex.quote(str(folder))} /dev/shm"]
        namespaces = ["--mount"]
    user = [] if uid == 0 else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    if uid != 0:
        setup += traversal_view(NEEDED_BY_OTHERS)  # the checkout and the interpreter, past root's 0700 home
    publish = shlex.join([*user, sys.executable, "-c", PUBLISH, str(prefix_file), str(ranks)])
    return ["unshare", *namespaces, "--propagation", "private", "--", "sh", "-c",
            " && ".join([*setup, f"exec {publish}"])]


@contextlib.contextmanager
def started_groups(folder: pathlib.Path | None, count: int, ranks: int, prefix_file: pathlib.Path,
                   one_owner: bool) -> Iterator[dict[int, int]]:
    """``count`` groups of ``ranks`` sleepers with their segments, in containers or (``folder``) all in that
    folder; yields the sleepers, host pid → the pid they see themselves. Kills every process of every
    group's mount namespace on the way out."""
    groups: list[Group] = []
    env = {**os.environ, "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        for first in range(0, count, PUBLISHERS_STARTING):
            commands = [group_command(folder, 0 if one_owner else FIRST_UID + g, prefix_file, ranks)
                        for g in range(first, min(count, first + PUBLISHERS_STARTING))]
            batch = [subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                     for command in commands]
            failed = []  # (process, its command); every one is read, so that each group that started is killed
            for process, command in zip(batch, commands, strict=True):
                assert process.stdout is not None
                if process.stdout.readline():  # PUBLISH's pids, once every segment is written
                    groups.append(Group(process, os.stat(f"/proc/{process.pid}/ns/mnt").st_ino))
                else:
                    failed.append((process, command))
            if failed:
                process, command = failed[0]
                raise RuntimeError(f"{len(failed)} groups' setup failed, the first with exit {process.wait(10)}: "
                                   f"{shlex.join(command)[:300]}")
        yield sleepers_of({group.mount_namespace for group in groups})
    finally:
        for group in groups:
            kill_namespace(group.mount_namespace)
        for group in groups:
            group.process.wait(30)


def sleepers_of(mount_namespaces: set[int]) -> dict[int, int]:
    """The ``sleep`` processes in those mount namespaces: host pid → innermost pid (NSpid's last)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{name}/ns/mnt").st_ino not in mount_namespaces:
                continue
            status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{name}/status").read_text().splitlines())
            if status["Name"].strip() == "sleep":
                found[int(name)] = int(status["NSpid"].split()[-1])
    return found


class RanksMismatch(Exception):
    """A snapshot without every sleeper as a running rank, placed as it is."""


def others_ranks(snapshot: pb.HostSnapshot, sleepers: dict[int, int], containers: bool,
                 collector: RanksCollector) -> int:
    """How many ranks in the snapshot are not the bench's (other jobs' on this host: they cost too).
    Raises RanksMismatch unless every sleeper is there, running, its pid in its container as NSpid says
    (containers) or unset (one folder)."""
    reported = {rank.pid: rank for rank in snapshot.ranks}
    missing = sleepers.keys() - reported.keys()
    wrong = [pid for pid in sleepers.keys() & reported.keys() if reported[pid].state != pb.RANK_STATE_RUNNING or (
        reported[pid].pid_in_container if reported[pid].HasField("pid_in_container") else None)
        != (sleepers[pid] if containers else None)]
    if missing or wrong:
        raise RanksMismatch(
            f"{len(sleepers)} ranks expected: {len(missing)} missing, {len(wrong)} not running or with a wrong "
            f"pid_in_container; files refused, per reason: {collector.refused()}")
    return len(reported.keys() - sleepers.keys())


@dataclasses.dataclass
class Interval:
    cpu_seconds: float  # collect() + fill()
    listed_proc: bool  # the container discovery listed /proc in it


@dataclasses.dataclass
class Measured:
    cold: Interval  # the first: every segment opened and verified
    intervals: list[Interval]  # the measured ones after it
    wall_seconds: float  # theirs
    others_ranks: int  # the most ranks not the bench's in one snapshot


def measure(sleepers: dict[int, int], folder: pathlib.Path | None, seconds: float,
            profile: cProfile.Profile | None) -> Measured:
    """``collect()`` + ``fill()`` of a ranks collector reading ``folder`` (None: /dev/shm and every
    container's), once per interval for ``seconds`` after the cold first one."""
    collector = RanksCollector(INTERVAL_SECONDS, directory=None if folder is None else str(folder))
    folders = collector._folders  # only to tell the intervals that listed /proc (its scan time changes)
    others = 0

    def one_interval(profiled: cProfile.Profile | None) -> Interval:
        nonlocal others
        scanned_at = folders._scanned_at
        began = time.process_time()
        with profiled or contextlib.nullcontext():
            collector.collect()
            snapshot = pb.HostSnapshot()
            collector.fill(snapshot)
        interval = Interval(time.process_time() - began, folders._scanned_at != scanned_at)
        others = max(others, others_ranks(snapshot, sleepers, folder is None, collector))
        return interval

    try:
        cold = one_interval(None)
        intervals: list[Interval] = []
        start = time.monotonic()
        while len(intervals) < seconds / INTERVAL_SECONDS:
            time.sleep(max(0.0, start + (len(intervals) + 1) * INTERVAL_SECONDS - time.monotonic()))
            intervals.append(one_interval(profile))
        return Measured(cold, intervals, time.monotonic() - start, others)
    finally:
        collector.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def row(phase: str, groups: int, ranks: int, processes: int, measured: Measured) -> str:
    def ms(values: list[float]) -> str:
        if not values:
            return "- | - | -"
        return " | ".join(f"{1e3 * v:.1f}" for v in (statistics.median(values), percentile(values, 0.99), max(values)))
    listing = [i.cpu_seconds for i in measured.intervals if i.listed_proc]
    others = [i.cpu_seconds for i in measured.intervals if not i.listed_proc]
    percent = 100 * sum(i.cpu_seconds for i in measured.intervals) / measured.wall_seconds
    return (f"| {phase} | {groups} × {ranks} | {measured.others_ranks} | {processes} | {percent:.2f} "
            f"| {1e3 * measured.cold.cpu_seconds:.0f} | {len(listing)} | {ms(listing)} | {ms(others)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=200, help="groups of ranks (containers)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per group")
    parser.add_argument("--ops", type=int, default=4, help="GEMM ops in each segment's slot table")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured intervals per phase")
    parser.add_argument("--one-owner", action="store_true", help="every rank runs as root (no per-group uid)")
    parser.add_argument("--phases", default="containers,one-folder", help="which phases, in order")
    parser.add_argument("--profile", type=pathlib.Path, metavar="FILE",
                        help="profile the containers phase's measured collect() + fill() (cProfile; its stats "
                             "written to FILE, the costliest functions printed)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the container discovery is a root agent's, and the bench makes namespaces")
    prefix = with_ops(recorded_segment(), args.ops)
    check_ops(prefix, args.ops)
    rows, results = [], {}
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="ranks-cost-") as scratch:
        os.chmod(scratch, 0o755)  # the groups' users read the prefix
        prefix_file = pathlib.Path(scratch) / "prefix"
        prefix_file.write_bytes(prefix)
        prefix_file.chmod(0o644)
        for phase in args.phases.split(","):
            containers = phase == "containers"
            with contextlib.ExitStack() as stack:
                folder = None if containers else pathlib.Path(
                    stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm", prefix="ranks-cost-")))
                if folder is not None:
                    folder.chmod(0o1777)  # as /dev/shm: every group's user writes there
                began = time.monotonic()
                sleepers = stack.enter_context(
                    started_groups(folder, args.containers, args.ranks, prefix_file, args.one_owner))
                setup_seconds = time.monotonic() - began
                if len(sleepers) != args.containers * args.ranks:
                    raise RuntimeError(f"{len(sleepers)} sleepers found, {args.containers * args.ranks} started")
                processes = sum(name.isdigit() for name in os.listdir("/proc"))
                result = measure(sleepers, folder, args.seconds, profile if containers else None)
            rows.append(row(phase, args.containers, args.ranks, processes, result))
            results[phase] = {"setup_seconds": setup_seconds, "processes": processes, **dataclasses.asdict(result)}
            print(f"{phase}: set up in {setup_seconds:.0f} s; {rows[-1]}", file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps(results))
    print(f"\nMachine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; commit {commit}; "
          f"load average {os.getloadavg()[0]:.1f}; {args.ops} GEMM ops per segment; "
          f"{'all ranks as root' if args.one_owner else 'a uid per group'}; {args.seconds:.0f} s per phase\n")
    print("| phase | groups × ranks | others' ranks | processes on the host | CPU % of a core | cold interval ms "
          "| intervals that listed /proc | their median ms | p99 | max | other intervals' median ms | p99 | max |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    print("\n".join(rows))
    if profile is not None:
        profile.dump_stats(args.profile)
        stats = pstats.Stats(profile, stream=sys.stdout)
        for order in ("cumulative", "tottime"):
            print(f"\nThe containers phase's measured collect() + fill(), by {order} time:\n")
            stats.sort_stats(order).print_stats(PROFILE_LINES)


if __name__ == "__main__":
    main()
