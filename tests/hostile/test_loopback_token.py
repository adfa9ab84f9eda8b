"""Where the admin's token goes: the loopback twin [::1], a port taken while agentd is down, clear text, token files.

The hostile user listens where the admin's command or agent will look (issue 24
items 2, 9, 11d): on [::1] beside an agent on 127.0.0.1 (Debian's /etc/hosts
names ::1 first for ``localhost``), on the agent's port before agentd starts,
on a non-loopback address of the namespace, and plants a token file of their own.
The squatter records what reaches it, so "no token" is read off what it got.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from testkit.ports import free_port

PYTHON = sys.executable
AGENTD = str(pathlib.Path(sys.executable).parent / "agentd")
TOKEN = "s3cret-admin-token"
SQUAT_SECONDS = 6.0

# Listens on argv[1]:argv[2], prints "ready <pid>", then for argv[3] seconds records every connection;
# at the end one JSON line: how many connections came, how many bytes, whether "Bearer" was among them.
# It answers the HTTP/2 preface with an empty SETTINGS frame and its ACK, so a gRPC client goes on to
# send its call's headers (with the token, which grpc does not Huffman-code: the control case shows it).
SQUATTER = """
import json, os, socket, sys, time
HTTP2_SETTINGS = bytes.fromhex("000000040000000000" "000000040100000000")
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAIT of an agent just stopped
server.bind((host, port))
server.listen()
print("ready", os.getpid(), flush=True)
deadline = time.monotonic() + seconds
connections, received = 0, b""
while (left := deadline - time.monotonic()) > 0:
    server.settimeout(left)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        break
    connections += 1
    conn.settimeout(1.0)
    conn.sendall(HTTP2_SETTINGS)  # as a gRPC server would: its client then sends the call's headers
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except TimeoutError:
        pass
    conn.close()
print(json.dumps({"connections": connections, "bytes": len(received), "bearer": b"Bearer" in received}))
"""

# Binds argv[1]:argv[2] and prints the outcome ("bound" or the errno name).
BIND = """
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
try:
    sock.bind((host, port))
    sock.listen()
    print("bound")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


@pytest.fixture
def shared_dir() -> Iterator[pathlib.Path]:
    """A folder in /tmp both users can write (sticky, as /tmp itself)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="tpl", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def admin_token(shared_dir) -> pathlib.Path:
    path = shared_dir / "admin.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def debian_hosts(namespace, shared_dir) -> None:
    """The namespace's /etc/hosts as Debian ships it: ``localhost`` is ::1 first, then 127.0.0.1."""
    hosts = shared_dir / "hosts"
    hosts.write_text("::1 localhost ip6-localhost ip6-loopback\n127.0.0.1 localhost\n")
    done = namespace.run(["mount", "--bind", str(hosts), "/etc/hosts"])
    assert done.returncode == 0, done.stderr
    resolved = namespace.run([PYTHON, "-c", "import socket; print(socket.getaddrinfo('localhost', 1, "
                              "type=socket.SOCK_STREAM)[0][4][0])"])
    assert resolved.stdout.strip() == "::1", resolved


def squat(namespace, user, host: str, port: int) -> tuple[subprocess.Popen[str], int]:
    """The squatter listening on ``host:port`` as ``user``, and its pid."""
    process = namespace.popen([PYTHON, "-c", SQUATTER, host, str(port), str(SQUAT_SECONDS)], user=user,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready = process.stdout.readline().split()
    if ready[:1] != ["ready"]:
        process.kill()
        raise AssertionError(f"squatter did not start: {ready} {process.communicate(timeout=10)[1]}")
    return process, int(ready[1])


def squatter_got(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=SQUAT_SECONDS + 10)
    assert process.returncode == 0, err
    return json.loads(out)


def tuiprof(namespace, *args: str) -> subprocess.CompletedProcess[str]:
    return namespace.run([PYTHON, "-m", "tuiprof.cli", *args], timeout=60)


def test_agent_on_loopback_also_holds_v6_twin(agent_in_namespace, run_as_hostile):
    agent = agent_in_namespace()
    for port in (agent.port, agent.metrics_port):
        done = run_as_hostile([PYTHON, "-c", BIND, "::1", str(port)])
        assert done.stdout.strip() == "EADDRINUSE", (port, done.stdout, done.stderr)
    agent.assert_healthy()


def test_status_localhost_sends_no_token_to_v6_squatter(namespace, hostile_user, debian_hosts, admin_token):
    port = free_port()
    squatter, pid = squat(namespace, hostile_user, "::1", port)
    done = tuiprof(namespace, "status", f"localhost:{port}", "--token-file", str(admin_token))
    got = squatter_got(squatter)
    assert got == {"connections": 0, "bytes": 0, "bearer": False}, got
    assert done.returncode == 2, done
    line = done.stderr.strip()
    assert "\n" not in line and "not sending the token" in line, line
    assert f"(uid {hostile_user.uid})" in line and f"pid {pid}" in line, line

    # Without a token there is nothing to protect: the same command reaches the squatter,
    # which shows the check above, not a failed lookup, is what kept it away.
    squatter, _ = squat(namespace, hostile_user, "::1", port)
    tuiprof(namespace, "status", "--timeout", "2", f"localhost:{port}")
    assert squatter_got(squatter)["connections"] > 0


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_agentd_exits_4_naming_who_took_its_port(namespace, hostile_user, shared_dir, host):
    port = free_port()
    squatter, pid = squat(namespace, hostile_user, host, port)
    done = namespace.run([AGENTD, "--host", "127.0.0.1", "--port", str(port), "--metrics-port",
                          str(free_port()), "--trace-dir", str(shared_dir / "traces")], timeout=60)
    squatter.kill()
    squatter.wait(10)
    assert done.returncode == 4, done
    line = done.stderr.strip().splitlines()[-1]
    assert f"port {port} on {host} is already in use by user {hostile_user.name} (uid {hostile_user.uid}), " \
           f"pid {pid}" in line, line


def test_token_refused_in_clear_beyond_loopback(namespace, hostile_user, admin_token):
    """A private address of the namespace (not loopback) stands for a remote host without TLS."""
    address = "10.254.0.1"
    done = namespace.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"])
    assert done.returncode == 0, done.stderr
    port = free_port()

    squatter, _ = squat(namespace, hostile_user, address, port)
    done = tuiprof(namespace, "status", f"{address}:{port}", "--token-file", str(admin_token))
    assert squatter_got(squatter) == {"connections": 0, "bytes": 0, "bearer": False}
    assert done.returncode == 2, done
    assert "in clear text" in done.stderr and "--allow-plaintext-token" in done.stderr, done.stderr

    # Asked for, the token goes (and the listener sees it: what the refusal above prevented).
    squatter, _ = squat(namespace, hostile_user, address, port)
    tuiprof(namespace, "status", "--timeout", "2", f"{address}:{port}", "--token-file", str(admin_token),
            "--allow-plaintext-token")
    assert squatter_got(squatter)["bearer"] is True


def test_token_file_planted_by_other_user_is_refused(namespace, hostile_user, run_as_hostile, shared_dir):
    planted = shared_dir / "planted.token"
    done = run_as_hostile(["sh", "-c", f"umask 077 && echo hostile-token > {planted}"])
    assert done.returncode == 0, done.stderr
    assert planted.stat().st_mode & 0o077 == 0  # passes the mode rule: only its owner is wrong

    agent = namespace.run([AGENTD, "--port", str(free_port()), "--metrics-port", str(free_port()),
                           "--trace-dir", str(shared_dir / "traces"), "--token-file", str(planted)], timeout=60)
    assert agent.returncode == 3, agent
    assert f"belongs to user {hostile_user.name}" in agent.stderr, agent.stderr

    status = tuiprof(namespace, "status", f"127.0.0.1:{free_port()}", "--token-file", str(planted))
    assert status.returncode == 2, status
    assert status.stderr.count("\n") == 1 and f"belongs to user {hostile_user.name}" in status.stderr, status.stderr


# The console's way to an agent (tuiprof/client/host_client.py), for a host it is told of after start
# (a SLURM node, a host added on screen): the check is made at every connection, not only on the command line.
CONSOLE_WATCH = """
import asyncio, sys
from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import HostClient
events = []
options = ConnectionOptions(token=sys.argv[2], timeout=2.0)
client = HostClient(AgentAddress.parse(sys.argv[1]), options, events.append)
asyncio.run(client.once(lambda snapshot: True, 3.0))
print("\\n".join(f"{type(event).__name__}: {getattr(event, 'error', '')}" for event in events))
"""


def test_console_reports_v6_squatter_unreachable_and_sends_no_token(namespace, hostile_user, debian_hosts):
    port = free_port()
    squatter, pid = squat(namespace, hostile_user, "::1", port)
    done = namespace.run([PYTHON, "-c", CONSOLE_WATCH, f"localhost:{port}", TOKEN], timeout=60)
    assert squatter_got(squatter) == {"connections": 0, "bytes": 0, "bearer": False}
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HostUnreachable: ") and done.stdout.count("\n") == 1, done.stdout
    assert "not sending the token" in done.stdout and f"pid {pid}" in done.stdout, done.stdout


def test_agent_without_ipv6_loopback_says_why_it_holds_127_only(namespace, agent_in_namespace):
    done = namespace.run(["sysctl", "-w", "net.ipv6.conf.lo.disable_ipv6=1"])
    assert done.returncode == 0, done.stderr
    agent = agent_in_namespace()
    agent.assert_healthy()
    assert "not listening on ::1: this host has no IPv6 loopback" in agent.log(), agent.log()


def test_token_fifo_planted_by_other_user_is_refused_without_hanging(namespace, hostile_user, run_as_hostile,
                                                                      shared_dir):
    planted = shared_dir / "planted.fifo"
    done = run_as_hostile(["mkfifo", "-m", "600", str(planted)])
    assert done.returncode == 0, done.stderr
    status = tuiprof(namespace, "status", f"127.0.0.1:{free_port()}", "--token-file", str(planted))
    assert status.returncode == 2, status
    assert "is not a regular file" in status.stderr, status.stderr


# One channel kept across an agent restart, as the console's and `tuiprof trace`'s are: a call after the
# agent stopped must not carry the token to whoever took the port meanwhile.
LONG_LIVED_CHANNEL = """
import asyncio, sys
import grpc
from agentd.address import AgentAddress
from agentd.proto import tuiprof_agent_pb2 as pb, tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import ConnectionOptions
async def main():
    options = ConnectionOptions(token=sys.argv[2], timeout=2.0)
    async with options.open(AgentAddress.parse(sys.argv[1])) as channel:
        stub = pb_grpc.AgentStub(channel)
        info = await stub.GetInfo(pb.GetInfoRequest(), timeout=5)
        print("first", bool(info.hostname), flush=True)
        sys.stdin.readline()
        try:
            await stub.Watch(pb.WatchRequest(), timeout=3).read()
            print("second OK")
        except grpc.aio.AioRpcError as exc:
            print("second", exc.code().name, exc.details())
asyncio.run(main())
"""


def test_channel_kept_across_restart_sends_no_token_to_who_took_the_port(namespace, hostile_user, agent_in_namespace,
                                                                         admin_token):
    agent = agent_in_namespace("--token-file", str(admin_token))
    client = namespace.popen([PYTHON, "-c", LONG_LIVED_CHANNEL, f"127.0.0.1:{agent.port}", TOKEN],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert client.stdout is not None and client.stdin is not None
    first = client.stdout.readline()
    assert first.strip() == "first True", (first, client.stderr and client.stderr.read())
    agent.process.terminate()
    assert agent.process.wait(30) == 0, agent.log()
    squatter, pid = squat(namespace, hostile_user, "127.0.0.1", agent.port)
    out, err = client.communicate("go\n", timeout=60)
    got = squatter_got(squatter)
    assert got == {"connections": 0, "bytes": 0, "bearer": False}, (got, out, err)
    assert out.startswith("second FAILED_PRECONDITION not sending the token") and f"pid {pid}" in out, (out, err)
