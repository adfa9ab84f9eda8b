"""End to end in a real terminal: tmux runs `tuiprof connect` against two real agents.

Both hosts show up; keys navigate; the agent on 127.0.0.2 is killed and its row
turns DOWN with the reason; it is restarted on the same port and comes back up
by itself (reconnect with backoff).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from testkit.agents import agentd_command, healthz_status, stop_process
from testkit.ports import free_port
from testkit.terminal import tmux_environment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

WIDTH, HEIGHT = 160, 40


class Agent:
    """An agentd on a fixed address and port, so it can be restarted where it was."""

    def __init__(self, tmp_path: pathlib.Path, host: str) -> None:
        self.host, self.port, self.metrics_port = host, free_port(host), free_port(host)
        self.directory = tmp_path / f"agent-{host}"
        self.directory.mkdir()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        args = ["--host", self.host, "--port", str(self.port), "--metrics-port", str(self.metrics_port),
                "--interval-ms", "500", "--trace-dir", str(self.directory / "traces")]
        env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
        with open(self.directory / "agentd.log", "ab") as log:
            self.process = subprocess.Popen(agentd_command(args), stdout=subprocess.DEVNULL, stderr=log, env=env)
        wait_for(lambda: healthz_status(self.host, self.metrics_port) == 200, 30, f"agentd on {self.target}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=10, env=tmux_environment()).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "console")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "console", *keys)

    def wait_screen(self, condition: Callable[[str], bool], timeout: float, what: str) -> str:
        seen = ""

        def check() -> bool:
            nonlocal seen
            seen = self.screen()
            return condition(seen)

        try:
            wait_for(check, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; screen was:\n{seen}") from None
        return seen


@pytest.fixture
def agents(tmp_path) -> Iterator[tuple[Agent, Agent]]:
    one, two = Agent(tmp_path, "127.0.0.1"), Agent(tmp_path, "127.0.0.2")
    try:
        one.start()
        two.start()
        yield one, two
    finally:
        one.stop()
        two.stop()


@pytest.fixture
def tmux(tmp_path) -> Iterator[Tmux]:
    session = Tmux(f"tuiprof-test-{os.getpid()}-{tmp_path.name}")
    yield session
    subprocess.run(["tmux", "-L", session.socket, "kill-server"], capture_output=True, timeout=10)


def row(screen: str, target: str) -> str:
    return next((line for line in screen.splitlines() if target in line), "")


def host_row(screen: str, name: str) -> str:
    """The table row whose first cell is ``name`` (a hang banner may name the host too)."""
    return next((line for line in screen.splitlines() if line.split()[:1] == [name]), "")


def test_connect_navigate_outage_and_recovery(agents, tmux, tmp_path) -> None:
    one, two = agents
    command = f"{sys.executable} -m tuiprof.cli connect {one.target} {two.target}"
    env = f"TERM=xterm-256color TEXTUAL_ANIMATIONS=none XDG_CONFIG_HOME={tmp_path}"  # not the user's settings
    tmux.run("new-session", "-d", "-s", "console", "-x", str(WIDTH), "-y", str(HEIGHT))
    tmux.run("set-option", "-t", "console", "remain-on-exit", "on")  # keep a crash on screen
    tmux.run("respawn-pane", "-k", "-t", "console", f"env {env} {command}")  # draws on stderr
    # The header and the rows are separate widgets: a frame may show one before the other.
    tmux.wait_screen(lambda s: "2/2 hosts up" in s and one.target in s and two.target in s, 30,
                     "both hosts up, each row labelled with its address (both agents have this host's name)")

    tmux.keys("j", "Enter")  # the second host's own view
    screen = tmux.wait_screen(lambda s: "GPUs" in s and "Net/Disk" in s, 10, "the host view")
    assert two.target in screen
    tmux.keys("3")
    tmux.wait_screen(lambda s: "nic lo" in s, 10, "the Net/Disk tab")
    tmux.keys("Escape")
    tmux.wait_screen(lambda s: "hosts up" in s, 10, "back to the cluster view")

    two.kill()
    screen = tmux.wait_screen(lambda s: "DOWN" in row(s, two.target), 20, "127.0.0.2 DOWN")
    assert "DOWN" not in row(screen, one.target) and "1/2 hosts up" in screen
    tmux.keys("G")  # the detail line explains the outage
    tmux.wait_screen(lambda s: "unreachable: cannot connect" in s and "last contact" in s, 10, "the reason")

    two.start()
    screen = tmux.wait_screen(lambda s: "2/2 hosts up" in s, 40, "127.0.0.2 back up")
    assert "DOWN" not in row(screen, two.target)

    tmux.keys("q")
    wait_for(lambda: tmux.run("display-message", "-p", "-t", "console", "#{pane_dead}").strip() == "1",
             10, "the console to quit")


def test_no_host_means_this_host_through_an_embedded_agent(tmux, tmp_path) -> None:
    """`tuiprof` alone: no daemon to install, this machine's CPU/memory/NICs/disks on screen."""
    tmux.run("new-session", "-d", "-s", "console", "-x", str(WIDTH), "-y", str(HEIGHT))
    tmux.run("set-option", "-t", "console", "remain-on-exit", "on")
    tmux.run("respawn-pane", "-k", "-t", "console",
             f"env TERM=xterm-256color TEXTUAL_ANIMATIONS=none XDG_CONFIG_HOME={tmp_path} {sys.executable} -m tuiprof.cli")
    # One host: the console opens on its host view, on the CPU tab here (no GPU on the test machine).
    screen = tmux.wait_screen(lambda s: "Net/Disk" in s and "all " in s, 30, "this host's view, CPU tab")
    assert f"{os.uname().nodename} (127.0.0.1:" in screen  # the embedded agent's loopback address
    tmux.keys("3")
    tmux.wait_screen(lambda s: "nic lo" in s, 10, "this host's NICs")
    tmux.keys("Escape")
    tmux.wait_screen(lambda s: "1/1 hosts up" in s and "%" in host_row(s, os.uname().nodename), 10,
                     "the cluster view, one key away")
    tmux.keys("q")
    wait_for(lambda: tmux.run("display-message", "-p", "-t", "console", "#{pane_dead}").strip() == "1",
             10, "the console to quit")
