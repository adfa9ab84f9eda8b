"""Terminal escapes in what another user writes: a rank's op names and the function names py-spy reads
from their process reach root's `tuiprof status` and `tuiprof stacks` as visible escapes, never as
sequences the terminal acts on (a clipboard write, a clear screen, a title)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import tempfile

from hostile.conftest import PYTHON, wait_ready
from hostile.test_metrics_abuse import publish
from native.segment_forge import recorded_segment
from testkit.op_segments import with_ops
from tuiprof.commands.run import launch_environment

# OSC 52 (write the clipboard) and CSI 2J (clear the screen), as an op name fits them (32 bytes).
EVIL_OP = b"x\x1b]52;c;aGk=\x07\x1b[2J"
# A rank parked in a function whose name writes the clipboard, sets the title and clears the screen.
PARKED = """
import ctypes, os, sys, time
lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
lib.tuiprof_record_step()
name = "parked\\x1b]52;c;aGk=\\x07\\x1b]0;owned\\x07\\x1b[2J"
def park():
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
park.__code__ = park.__code__.replace(co_name=name, co_qualname=name)
park()
"""


def no_terminal_escapes(text: str) -> bool:
    return "\x1b" not in text and "\x07" not in text and not any(0x80 <= ord(c) <= 0x9F for c in text)


def test_a_users_op_names_reach_roots_status_escaped(agent_in_namespace, namespace, hostile_user):
    agent = agent_in_namespace()
    prefix = with_ops(recorded_segment(), 1, op=EVIL_OP)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="tpesc") as template:
        template.write(prefix)
        template.flush()
        pathlib.Path(template.name).chmod(0o644)
        publisher, [pid] = publish(namespace, pathlib.Path(template.name), 1, hostile_user)
        try:
            seen = agent.client("snapshot", "--rank-pid", str(pid))
            assert seen["code"] == "OK", seen
            status = namespace.run([PYTHON, "-m", "tuiprof.cli", "status", "--json", f"127.0.0.1:{agent.port}"])
        finally:
            publisher.kill()
            publisher.wait(10)
    (rank,) = [r for r in seen["reply"]["ranks"] if r["pid"] == pid]
    assert rank["gemm"][0]["op"] == "x\\x1b]52;c;aGk=\\x07\\x1b[2J"  # shown, escaped, by the agent itself
    assert status.returncode == 0, status.stderr
    assert no_terminal_escapes(status.stdout)
    ops = [op["op"] for host in json.loads(status.stdout)["hosts"] for r in host["ranks"] if r["pid"] == pid
           for op in r["gemm"]]
    assert ops == ["x\\x1b]52;c;aGk=\\x07\\x1b[2J"]


def test_a_users_function_names_reach_roots_stacks_escaped(agent_in_namespace, namespace, hostile_user):
    agent = agent_in_namespace()
    env = launch_environment(namespace.env(hostile_user) | {"RANK": "0"}, kineto_daemon=False)
    rank = wait_ready(namespace.popen([PYTHON, "-c", PARKED], user=hostile_user, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        assert agent.client("snapshot", "--rank-pid", str(rank.pid))["code"] == "OK"
        stacks = namespace.run([PYTHON, "-m", "tuiprof.cli", "stacks", f"127.0.0.1:{agent.port}"], timeout=120)
        folded = namespace.run([PYTHON, "-m", "tuiprof.cli", "stacks", "--folded", f"127.0.0.1:{agent.port}"],
                               timeout=120)
    finally:
        rank.kill()
        rank.wait(10)
    for done in (stacks, folded):
        assert no_terminal_escapes(done.stdout + done.stderr), done.stdout
    assert "parked\\x1b]52;c;aGk=\\x07\\x1b]0;owned\\x07\\x1b[2J" in stacks.stdout, stacks.stdout
