"""Squatting the names of another user's rank files does not hide their ranks (issue 24 item 7).

The user tuiprof-hostile creates, in the namespace's /dev/shm, every name they can predict for
root's next ranks: ``tuiprof-0-<pid>`` and its ``.inert``, ``.exception`` and ``.flight`` names
for the next pids. Before, root's hook found a file in the way, stayed inert without a note,
and the rank was in no view. Now the hook's names end in a part drawn from getrandom: root's rank
is reported with its figures, and the squatted files are refused and left alone.
"""

from __future__ import annotations

import json

from hostile.conftest import PYTHON
from tuiprof_native import segment

SQUATTED_PIDS = 3000
SUFFIXES = ("", segment.INERT_SUFFIX, segment.EXCEPTION_SUFFIX, segment.FLIGHT_SUFFIX)

# As the other user: every predictable name of uid 0 for the next pids, each an empty file of theirs that
# anyone may write (empty: 12000 files take no page of the namespace's 8 MiB /dev/shm, which root's
# segment needs; an empty note is what a hook leaves when no page was left). Prints the pids squatted.
SQUAT = """
import json, os, sys
count, suffixes = int(sys.argv[1]), json.loads(sys.argv[2])
last, limit = (int(open(f"/proc/sys/kernel/{name}").read()) for name in ("ns_last_pid", "pid_max"))
pids = [pid if pid < limit else pid - limit + 300 for pid in range(last + 1, last + 1 + count)]  # pids wrap to 300
for pid in pids:
    for suffix in suffixes:
        os.close(os.open(f"/dev/shm/tuiprof-0-{pid}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
print(json.dumps(pids))
"""


def test_a_user_who_squats_roots_next_names_does_not_hide_its_ranks(agent_in_namespace, start_rank, namespace,
                                                                    hostile_user, run_as_hostile):
    agent = agent_in_namespace()
    squat = run_as_hostile([PYTHON, "-c", SQUAT, str(SQUATTED_PIDS), json.dumps(SUFFIXES)], timeout=120)
    assert squat.returncode == 0, squat.stderr
    squatted_pids = json.loads(squat.stdout)
    roots = start_rank(None, "root-rank")
    # all its predictable names were taken (pids are the host's: others' processes took some of the range)
    assert roots.pid in squatted_pids, (squatted_pids[0], roots.pid)

    seen = agent.client("snapshot", "--rank-pid", str(roots.pid))
    assert seen["code"] == "OK", (seen, agent.log())
    (rank,) = [r for r in seen["reply"]["ranks"] if r["pid"] == roots.pid]
    assert rank["uid"] == 0 and rank["state"] == "RANK_STATE_RUNNING", rank
    assert int(rank["stepCount"]) >= 1 and not rank.get("hook", {}).get("inactiveReason"), rank
    # The other user sees the rank too (metrics of every rank are every local user's to see).
    theirs = agent.client("snapshot", "--rank-pid", str(roots.pid), user=hostile_user)
    assert theirs["code"] == "OK" and roots.pid in {r["pid"] for r in theirs["reply"]["ranks"]}

    listed = namespace.run(["ls", "-ln", "/dev/shm"])
    squatted = [line.split() for line in listed.stdout.splitlines() if f" tuiprof-0-{roots.pid}" in line]
    by_name = {fields[-1]: fields for fields in squatted}
    for suffix in SUFFIXES:  # left as the other user made them
        assert by_name[f"tuiprof-0-{roots.pid}{suffix}"][2] == str(hostile_user.uid), by_name
    (own,) = [name for name, fields in by_name.items()
              if fields[2] == "0" and segment.parse_name(name) == (0, roots.pid, False)]
    assert own.startswith(f"tuiprof-0-{roots.pid}-") and len(own) == len(f"tuiprof-0-{roots.pid}-") + 16, own
    refused = {r["reason"]: int(r.get("files", 0)) for r in seen["reply"]["rankSegmentsRefused"]}
    assert refused.get("owner", 0) + refused.get("over-cap", 0) >= SQUATTED_PIDS, refused
    agent.assert_healthy(user=hostile_user)

