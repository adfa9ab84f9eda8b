"""Issue 24 item 4, by the user tuiprof-hostile against the root agent in its namespace: segments
claiming more ops than the per-owner budget, and more concurrent /metrics scrapes than the agent serves.

The user publishes real segments (their own ``sleep`` processes, each segment claiming 511
GEMM ops), more than ``MAX_OPS_PER_OWNER`` in all, next to one of root's. The agent reports
the budget's worth of theirs, counts the rest per owner with the reason (snapshot, /metrics,
log), and reports root's rank whole. Then the user scrapes /metrics on many connections at
once: the agent serves at most ``MAX_CONNECTIONS_PER_PEER`` of theirs (the rest get 503 at
once, also while they hold that many open and idle), its threads and memory stay bounded, and
/healthz answers root within a second throughout.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import tempfile
import threading
import time

from agentd.collectors.ranks import MAX_OPS_PER_OWNER
from agentd.metrics_http import MAX_CONNECTIONS_PER_PEER
from hostile.conftest import HEALTHY_WITHIN_SECONDS, PYTHON
from native.segment_forge import recorded_segment
from testkit.op_segments import MAX_OPS_PER_SEGMENT, PUBLISH, check_ops, with_ops

HOSTILE_SEGMENTS = MAX_OPS_PER_OWNER // MAX_OPS_PER_SEGMENT + 2  # two segments' worth past the budget
SHM_SIZE = "64m"
SCRAPERS = 40
SCRAPE_SECONDS = 6.0
HELD = 2 * MAX_CONNECTIONS_PER_PEER
# What the agent may add while scraped: its threads beyond the connections it serves, and memory (one
# exposition in memory and the connections' buffers; rendering per scrape took hundreds of MB here).
THREAD_SLACK = 4
RSS_GROWTH_LIMIT_KB = 100 << 10

# Run as the user. First SCRAPERS threads GET /metrics over and over (a new connection each time) for
# SCRAPE_SECONDS; prints how often each status came (or the error that ended a request). Then it opens
# HOLD connections and sends nothing on them; prints how many were answered 503 at once, and keeps them
# open until stdin closes.
SCRAPE = """
import collections, http.client, json, select, socket, sys, threading, time
port, threads, seconds, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seen = collections.Counter()
lock = threading.Lock()
def scrape():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            response.read()
            outcome = str(response.status)
        except OSError as exc:
            outcome = type(exc).__name__
        finally:
            connection.close()
        with lock:
            seen[outcome] += 1
workers = [threading.Thread(target=scrape) for _ in range(threads)]
for worker in workers: worker.start()
for worker in workers: worker.join()
print(json.dumps(seen), flush=True)
held = []
for _ in range(hold):
    held.append(socket.create_connection(("127.0.0.1", port)))
    time.sleep(0.02)
time.sleep(1.0)  # every answer there is has come
readable, _, _ = select.select(held, [], [], 0)
print(sum(s.recv(64).startswith(b"HTTP/1.1 503") for s in readable), flush=True)
sys.stdin.read()
"""
METRICS = """
import http.client, sys
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
connection.request("GET", "/metrics")
sys.stdout.write(connection.getresponse().read().decode())
"""


def publish(namespace, template: pathlib.Path, count: int, user) -> tuple[subprocess.Popen[str], list[int]]:
    """``count`` segments of ``template`` published by ``user`` (None: root) for sleeps of theirs."""
    publisher = namespace.popen([PYTHON, "-c", PUBLISH, str(template), str(count)], user=user,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert publisher.stdout is not None
    line = publisher.stdout.readline()
    if not line:
        publisher.kill()
        raise AssertionError(f"publisher failed: {publisher.communicate(timeout=10)[1]}")
    return publisher, json.loads(line)


def snapshot_with(agent, pids: list[int]) -> dict:
    """The first snapshot that lists every one of ``pids`` (asked as root)."""
    for _ in range(20):
        seen = agent.client("snapshot", "--rank-pid", str(max(pids)))
        assert seen["code"] == "OK", seen
        snapshot = seen["reply"]
        if set(pids) <= {rank["pid"] for rank in snapshot["ranks"]}:
            return snapshot
    raise AssertionError(f"pids {pids} never all in one snapshot")


def agent_status(pid: int) -> tuple[int, int]:
    """(threads, VmRSS in KiB) of ``pid``, from the kernel."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def test_a_users_ops_past_the_budget_are_counted_and_their_scrapes_are_bounded(agent_in_namespace, namespace,
                                                                             hostile_user):
    # The namespace's 8 MiB /dev/shm holds fewer segments than this (their slot tables are written).
    namespace.run(["mount", "-o", f"remount,size={SHM_SIZE}", "/dev/shm"]).check_returncode()
    agent = agent_in_namespace()
    prefix = with_ops(recorded_segment(), MAX_OPS_PER_SEGMENT)
    check_ops(prefix, MAX_OPS_PER_SEGMENT)
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="tpops") as template:
        template.write(prefix)
        template.flush()
        pathlib.Path(template.name).chmod(0o644)  # the other user reads it too
        theirs, their_pids = publish(namespace, pathlib.Path(template.name), HOSTILE_SEGMENTS, hostile_user)
        roots, root_pids = publish(namespace, pathlib.Path(template.name), 1, None)
    try:
        snapshot = snapshot_with(agent, their_pids + root_pids)
        ranks = {rank["pid"]: rank for rank in snapshot["ranks"]}
        published = HOSTILE_SEGMENTS * MAX_OPS_PER_SEGMENT
        assert sum(len(ranks[pid].get("gemm", [])) for pid in their_pids) == MAX_OPS_PER_OWNER
        [dropped] = snapshot["rankOpsDropped"]
        assert (dropped["uid"], int(dropped["ops"])) == (hostile_user.uid, published - MAX_OPS_PER_OWNER)
        assert f"published {published} ops" in dropped["reason"] and str(MAX_OPS_PER_OWNER) in dropped["reason"]
        cut = [pid for pid in their_pids if "ops" in ranks[pid].get("unavailable", {})]
        assert cut and all("per-owner budget" in ranks[pid]["unavailable"]["ops"] for pid in cut)
        [root_pid] = root_pids
        assert len(ranks[root_pid]["gemm"]) == MAX_OPS_PER_SEGMENT and "ops" not in ranks[root_pid].get(
            "unavailable", {})  # root's rank whole: the budget is per owner
        assert agent.log().count("rank ops over the per-owner budget") == 1

        exposition = namespace.run([PYTHON, "-c", METRICS, str(agent.metrics_port)]).stdout
        assert f'tuiprof_rank_ops_dropped{{hostname="{snapshot["hostname"]}",uid="{hostile_user.uid}"}} ' \
               f'{published - MAX_OPS_PER_OWNER}\n' in exposition
        calls = re.findall(r'^tuiprof_rank_gemm_calls_total\{[^}]*pid="(\d+)"', exposition, re.M)
        assert sum(int(pid) in their_pids for pid in calls) == MAX_OPS_PER_OWNER
        assert sum(int(pid) == root_pid for pid in calls) == MAX_OPS_PER_SEGMENT

        threads_before, rss_before = agent_status(agent.process.pid)
        peak = [threads_before, rss_before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                threads, rss = agent_status(agent.process.pid)
                peak[0], peak[1] = max(peak[0], threads), max(peak[1], rss)

        sampler = threading.Thread(target=sample)
        sampler.start()
        scrapers = namespace.popen([PYTHON, "-c", SCRAPE, str(agent.metrics_port), str(SCRAPERS),
                                    str(SCRAPE_SECONDS), str(HELD)], user=hostile_user, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert scrapers.stdout is not None
        try:
            time.sleep(1.0)  # the scrapers are at it
            health = [agent.client("healthz", "--metrics-port", str(agent.metrics_port)) for _ in range(3)]
            outcomes = json.loads(scrapers.stdout.readline() or "null")
            refused_at_once = int(scrapers.stdout.readline() or -1)
            # their connections held open, as many as the agent serves them: others are still served
            health += [agent.client("healthz", "--metrics-port", str(agent.metrics_port))]
            _, err = scrapers.communicate("", timeout=60)
        finally:
            done.set()
            sampler.join()
        assert scrapers.returncode == 0, err
        assert all(h["status"] == 200 and h["seconds"] < HEALTHY_WITHIN_SECONDS for h in health), health
        assert set(outcomes) <= {"200", "503"} and outcomes.get("200", 0) > 0, outcomes
        assert refused_at_once == HELD - MAX_CONNECTIONS_PER_PEER
        assert peak[0] <= threads_before + MAX_CONNECTIONS_PER_PEER + THREAD_SLACK, (threads_before, peak)
        assert peak[1] - rss_before < RSS_GROWTH_LIMIT_KB, (rss_before, peak)
        agent.assert_healthy()
    finally:
        for publisher in (theirs, roots):
            publisher.communicate("", timeout=30)
