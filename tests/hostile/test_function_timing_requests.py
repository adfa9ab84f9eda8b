"""Function timing switched at run time, attacked by a second local user: their request file beside a
root rank's segment is ignored by the rank, and the agent refuses them the rank's switch; the root
agent's own request still gets through (it replaces their file)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from hostile.conftest import PYTHON
from testkit.namespaces import wait_ready
from tuiprof.commands.run import launch_environment

# A rank (a step starts the hook), calling json.dumps all the time; "doc" on stdin prints what its
# function timer would publish now.
RANK = textwrap.dedent("""
    import ctypes, json, os, sys, threading, time
    import tuiprof_functions
    ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
    def busy():
        while True:
            json.dumps([1])
            time.sleep(0.01)
    threading.Thread(target=busy, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        print(tuiprof_functions.installed.document(), flush=True)
""")

# The other user, inside the namespace: a well-formed request beside the rank's segment, their own file.
SQUAT = textwrap.dedent("""
    import glob, json, os, sys
    [segment] = [p for p in glob.glob(f"/dev/shm/tuiprof-0-{sys.argv[1]}-*") if "." not in os.path.basename(p)]
    with open(segment + ".functions-request", "w") as out:
        json.dump({"serial": 1, "start": ["json@dumps"], "stop": []}, out)
    os.chmod(segment + ".functions-request", 0o644)
    print(segment)
""")


def published(rank: subprocess.Popen[str]) -> dict:
    rank.stdin.write("doc\n")
    rank.stdin.flush()
    return json.loads(rank.stdout.readline())


def test_another_users_request_is_ignored_and_their_call_refused(namespace, agent_in_namespace, hostile_user,
                                                                run_as_hostile):
    agent = agent_in_namespace()
    env = {**launch_environment(namespace.env(None), kineto_daemon=False), "TUIPROF_TIME_FUNCTIONS_DEFAULTS": "0"}
    rank = wait_ready(namespace.popen([PYTHON, "-c", RANK], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        squat = run_as_hostile([sys.executable, "-c", SQUAT, str(rank.pid)])
        assert squat.returncode == 0, squat.stderr
        time.sleep(2.5)  # the rank looks at requests once a second
        document = published(rank)
        assert document["functions"] == [] and "request" not in document, document  # their file was not believed

        refused = agent.client("function-timing", "--pid", str(rank.pid), "--start", "json@dumps", user=hostile_user)
        assert refused["code"] == "PERMISSION_DENIED", refused
        assert refused["details"] == (f"pid {rank.pid} is not yours (uid {hostile_user.uid}): a rank's function "
                                      "timing is switched only by its owner, root, or with the token")

        # root's request replaces their file (root may, in the sticky folder) and the rank applies it
        answer = agent.client("function-timing", "--pid", str(rank.pid), "--start", "json@dumps")
        assert answer["code"] == "OK" and answer["reply"].get("acknowledged"), answer
        timed = published(rank)
        assert [f["name"] for f in timed["functions"]] == ["json:dumps"] and timed["request"]["problems"] == []
        agent.assert_healthy(user=hostile_user)
    finally:
        rank.kill()
        rank.wait(10)
