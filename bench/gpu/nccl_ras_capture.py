"""Real NCCL RAS bytes (issue 29 item 8): our client against the RAS of live PyTorch NCCL jobs.

Two jobs on the one GPU, one after the other, each asked while it runs, in JSON and in text:

1. ``one-rank``: world size 1, some all-reduces, then it sleeps (a healthy job). If nothing
   listens on 127.0.0.1:28028, it is started again with ``NCCL_RAS_ENABLE=1`` and asked again.
2. ``two-rank``: two processes on the same GPU, told apart as two hosts by ``NCCL_HOSTID`` (NCCL
   refuses two ranks of one host on one GPU) and joined over sockets on lo; rank 1 launches one
   all-reduce fewer than rank 0, so RAS sees a count mismatch (rank 0's last one waits forever).

Every conversation's bytes are written raw: ``<job>-<format>.sent`` and ``<job>-<format>.received``;
``summary.json`` has what ``agentd.hang.ras_reader`` made of them and who held the port.

    . bench/gpu/device_env.sh $OUT; python3 bench/gpu/nccl_ras_capture.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentd import peer  # noqa: E402  (the checkout, not an installed agentd)
from agentd.hang import nccl_ras, ras_reader  # noqa: E402

WORKER = r"""
import os, sys, time, pathlib, torch, torch.distributed as dist
rank, world, launches = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=world, init_method="tcp://127.0.0.1:29533",
                        device_id=torch.device("cuda:0"))
x = torch.ones(1 << 16, device="cuda")
for _ in range(launches):
    dist.all_reduce(x)
if launches == int(sys.argv[4]):      # the ranks that are not ahead finish theirs
    torch.cuda.synchronize()
print("launched", launches, "nccl", torch.cuda.nccl.version(), flush=True)
pathlib.Path(sys.argv[5]).write_text(str(os.getpid()))
time.sleep(600)
"""


class Recording:
    """A socket that keeps what was sent and received."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.sent, self.received = conn, bytearray(), bytearray()

    def sendall(self, data: bytes, /) -> None:
        self.sent += data
        self.conn.sendall(data)

    def recv(self, size: int, /) -> bytes:
        chunk = self.conn.recv(size)
        self.received += chunk
        return chunk

    def settimeout(self, value: float | None, /) -> None:
        self.conn.settimeout(value)


def ask(out: pathlib.Path, name: str, want_json: bool, pids: list[int]) -> dict[str, object]:
    """One conversation with RAS; its bytes saved under ``name``."""
    address = ras_reader.ras_address()
    result: dict[str, object] = {"name": name}
    try:
        holder = peer.tcp_listener(address)
        result["listener"] = None if holder is None else {"uid": holder.uid, "pids": list(holder.pids)}
    except peer.PeerLookupError as exc:
        result["listener"] = f"unknown: {exc}"
    try:
        conn = socket.create_connection(address, timeout=10)
    except OSError as exc:
        result["error"] = f"connect: {exc}"
        return result
    recording = Recording(conn)
    start = time.monotonic()
    try:
        if want_json:
            answer_format, answer = ras_reader.converse(recording, start + 12)
        else:  # the text form: the conversation an older NCCL has (no SET FORMAT)
            recording.sendall(b"CLIENT PROTOCOL 2\n")
            recording.sendall(b"STATUS\n")
            answer_format, answer = "text", ras_reader._BoundedReader(recording, start + 12, time.monotonic).rest()
            answer = answer.split(b"\n", 1)[1]  # the SERVER PROTOCOL line
        report = ras_reader.parse(answer_format, answer)
        result.update(format=answer_format, seconds=round(time.monotonic() - start, 3),
                      evidence=nccl_ras.evidence(report, pids), report=repr(report))
    except ras_reader.RasUnavailable as exc:
        result["error"] = str(exc)
    finally:
        conn.close()
        (out / f"{name}.sent").write_bytes(bytes(recording.sent))
        (out / f"{name}.received").write_bytes(bytes(recording.received))
    result["read_ras"] = repr(ras_reader.read_ras(address, os.getuid(), pids))
    return result


def start_job(out: pathlib.Path, name: str, launches: list[int], env: dict[str, str],
              per_rank_env: list[dict[str, str]]) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    ready = [out / f"{name}-rank{rank}.ready" for rank in range(len(launches))]
    procs = []
    for rank, n in enumerate(launches):
        with open(out / f"{name}-rank{rank}.log", "wb") as log:  # the child keeps its own copy
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(rank), str(len(launches)), str(n),
                                           str(min(launches)), str(ready[rank])],
                                          env=os.environ | env | per_rank_env[rank], stdout=log,
                                          stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and not all(r.exists() for r in ready):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    time.sleep(2)  # RAS's own peers settle
    return procs, [p.pid for p in procs]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    base = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,RAS"}
    for enable in ({}, {"NCCL_RAS_ENABLE": "1"}):
        name = "one-rank" + ("-ras-enabled" if enable else "")
        procs, pids = start_job(out, name, [20], base | enable, [{}])
        asked = [ask(out, f"{name}-json", True, pids), ask(out, f"{name}-text", False, pids)]
        stop(procs)
        runs.append({"job": name, "env": enable, "pids": pids, "asked": asked})
        if not all("connect" in str(a.get("error", "")) for a in asked):
            break
    two = base | {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
                  "NCCL_SHM_DISABLE": "1"}
    procs, pids = start_job(out, "two-rank", [12, 11], two,
                            [{"NCCL_HOSTID": "tuiprof-ras-a"}, {"NCCL_HOSTID": "tuiprof-ras-b"}])
    asked = [ask(out, "two-rank-json", True, pids), ask(out, "two-rank-text", False, pids)]
    stop(procs)
    runs.append({"job": "two-rank", "env": two, "pids": pids, "asked": asked})
    (out / "summary.json").write_text(json.dumps(runs, indent=1))
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
