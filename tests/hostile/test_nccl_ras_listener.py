"""NCCL's RAS port against the user tuiprof-hostile (issue 29 item 8), in the private namespace.

RAS listens on 127.0.0.1:28028, which any local user may take when no NCCL job holds it. The user
listens there with a replay of a real RAS answer whose counts name a rank of root's job as behind;
the root agent, asked about that job, must neither talk to the listener nor believe it, and must say
who holds the port.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from hostile.conftest import PYTHON
from testkit.namespaces import wait_ready

pytestmark = pytest.mark.slow
RAS_DATA = pathlib.Path(__file__).parents[1] / "agent" / "data" / "nccl_ras"

# As the user: listen on RAS's port, answer like NCCL 2.28.9 (the captured bytes, hex in argv[1]), and
# print what each client sent: a "heard" line means the agent spoke to the listener.
LISTENER = """
import socket, sys
answer = bytes.fromhex(sys.argv[1])
server = socket.socket()
server.bind(("127.0.0.1", 28028))
server.listen()
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(2)
    try:
        print("heard", conn.recv(4096), flush=True)
        conn.sendall(answer)
    except OSError:
        pass
    conn.close()
"""

# As root, in the namespace: what the agent's reader makes of the port for a job of root's.
ASK = """
import json, os, sys
from agentd.hang import ras_reader
reading = ras_reader.read_ras(("127.0.0.1", 28028), 0, {int(sys.argv[1])})
print(json.dumps({"unavailable": reading.unavailable, "listener": reading.listener,
                  "report": reading.report is not None}))
"""


def test_a_users_listener_on_the_ras_port_is_named_and_not_believed(namespace, hostile_user) -> None:
    answer = (RAS_DATA / "two-rank-json.received").read_bytes()
    listener = wait_ready(namespace.popen([PYTHON, "-c", LISTENER, answer.hex()], user=hostile_user,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    job = namespace.popen(["sleep", "60"])  # a rank of root's job
    try:
        asked = namespace.run([PYTHON, "-c", ASK, str(job.pid)])
        assert asked.returncode == 0, asked.stderr
        reading = json.loads(asked.stdout)
        assert not reading["report"]
        assert f"uid {hostile_user.uid}" in reading["listener"]
        assert "not by this job's owner: not asked, not believed" in reading["unavailable"]
        assert f"uid {hostile_user.uid}" in reading["unavailable"]
    finally:
        job.kill()
        listener.kill()
        job.wait()
    heard, _ = listener.communicate()
    assert "heard" not in heard, f"the agent spoke to the other user's listener: {heard}"
