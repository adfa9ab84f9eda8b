"""A full /dev/shm, through the whole chain: a real PyTorch CPU training loop of the user
tuiprof-hostile, in `tuiprof run`'s environment, finds no room for its segment, trains on and
exits 0; the root agent reports the rank with the reason, and the user's own `tuiprof status
--json` shows it. (tests/native test the hook and the collector alone.)

The trainer runs as the user, with the environment `tuiprof run` gives (launch_environment): not
through `tuiprof run` itself, whose exec of this checkout's Python by that user fails where the
interpreter lives under root's 0700 home (see start_rank in conftest).
"""

from __future__ import annotations

import json
import subprocess
import time

from hostile.conftest import PYTHON
from tuiprof.commands.run import launch_environment
from tuiprof_native import segment

REPORTED_WITHIN_SECONDS = 30.0
# Room left in /dev/shm: enough for the hook's one-line note, not for a segment.
ROOM_LEFT_BYTES = 256 * 1024
FILL = """
import os
free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.posix_fallocate(fd, 0, free - int(os.environ["ROOM_LEFT_BYTES"]))
print(os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize)
"""
# A few SGD steps of a tiny model, then (while the test looks at the agent) a wait for a line on
# stdin, then a few more steps: the job must run to its end unchanged.
TRAIN = """
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def steps():
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(16, 8)).pow(2).mean().backward()
        opt.step()
steps()
print("trained", flush=True)
sys.stdin.readline()
steps()
print("done", flush=True)
"""


def reported_rank(namespace, agent, user, pid: int) -> dict:
    """The rank ``pid`` in `tuiprof status --json`, run by ``user`` inside the namespace."""
    deadline = time.monotonic() + REPORTED_WITHIN_SECONDS
    while True:
        done = namespace.run([PYTHON, "-m", "tuiprof.cli", "status", "--json", f"127.0.0.1:{agent.port}"],
                             user=user)
        assert done.returncode == 0, done.stderr
        [host] = json.loads(done.stdout)["hosts"]
        ranks = [rank for rank in host["ranks"] or [] if rank["pid"] == pid]
        if ranks:
            return ranks[0]
        assert time.monotonic() < deadline, f"rank {pid} not in status after {REPORTED_WITHIN_SECONDS} s: {host}"
        time.sleep(0.5)


def test_a_users_training_in_a_full_shm_exits_0_and_their_status_says_why(agent_in_namespace, namespace,
                                                                         hostile_user):
    agent = agent_in_namespace()
    filled = namespace.run([PYTHON, "-c", FILL], env=namespace.env(None) | {"ROOM_LEFT_BYTES": str(ROOM_LEFT_BYTES)})
    assert filled.returncode == 0, filled.stderr
    assert int(filled.stdout) < segment.SEGMENT_SIZE, filled.stdout  # no room for a segment
    trainer = namespace.popen([PYTHON, "-c", TRAIN], user=hostile_user,
                              env=launch_environment(namespace.env(hostile_user)), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == "trained\n"
        rank = reported_rank(namespace, agent, hostile_user, trainer.pid)
        out, err = trainer.communicate("go on\n", timeout=60)
    finally:
        trainer.kill()
        trainer.wait(10)
    assert trainer.returncode == 0, err
    assert out == "done\n"
    reason = rank["hook"]["inactive_reason"]
    assert reason.startswith("shared memory full: "), rank
    # And the user's console said so when the job started.
    assert f"tuiprof: telemetry off in pid {trainer.pid}: {reason}; training continues" in err.splitlines(), err
    agent.assert_healthy(user=hostile_user)
