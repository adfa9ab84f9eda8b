"""The console's cost per watched GPU against nvitop's, side by side on one GPU host.

    python3 bench/console/console_nvitop.py --terminal pty --seconds 60 --warmup 15 --nvitop-path /tmp/nv

Each viewer runs in its own terminal, 200x60, all at the same 1 s refresh and
all at once, so they watch the same GPUs under the same load. ``--terminal pty``:
a pseudo-terminal (TERM=xterm-256color) whose output this script reads as fast
as it comes, counting the bytes; ``--terminal tmux``: a detached tmux session on
a tmux server of its own, so that server's cost (a terminal emulator's work for
that viewer) is measured too. The viewers:

- ``tuiprof --interval 1``: the console with its agent embedded in its process;
- ``tuiprof connect 127.0.0.1:PORT --interval 1`` to a separate ``agentd
  --interval-ms 1000``: console and agent measured apart and together;
- ``nvitop --monitor full --interval 1``.

Both consoles are sent Enter once connected, which opens the host's view (its
GPUs, one line each, and their processes), the screen comparable to nvitop's.

After the warm-up, over the window: CPU seconds per wall second of each process
tree (user + system), resident memory (sampled once a second: mean and max), and
(pty) the bytes each viewer wrote to its terminal. Figures per watched GPU divide
by the GPUs NVML reports. Output: one JSON object on stdout and in OUT/result.json,
and each viewer's screen (pty: the last 64 KiB it wrote; tmux: the pane's text),
to check it drew the GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import pathlib
import pty
import select
import shlex
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import psutil

COLUMNS, LINES = 200, 60
TAIL_BYTES = 64 * 1024
GPU_NAMES = (b"H100", b"H200")  # seen in a viewer's output: it drew the GPU
OPEN_HOST_AFTER_S = 8.0  # the consoles have connected by then


class PtyTerminal:
    """A program in its own pseudo-terminal, its output drained and counted."""

    tmux_server_pid = None

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env,
            start_new_session=True, preexec_fn=_take_controlling_terminal,
        )
        os.close(slave)
        self._master = master
        self.bytes_written = 0
        self.tail = bytearray()
        self.saw_gpu_name = False
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            select.select([self._master], [], [], 1.0)
            try:
                chunk = os.read(self._master, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # EIO: the program closed the terminal
                return
            if not chunk:
                return
            self.bytes_written += len(chunk)
            seam = bytes(self.tail[-8:]) + chunk
            self.saw_gpu_name = self.saw_gpu_name or any(name in seam for name in GPU_NAMES)
            self.tail += chunk
            del self.tail[:-TAIL_BYTES]

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def press_enter(self) -> None:
        os.write(self._master, b"\r")

    def screen(self) -> bytes:
        return bytes(self.tail)

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(2)
        os.close(self._master)


def _take_controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class TmuxTerminal:
    """A program in a detached tmux session on a tmux server of its own (``-L``)."""

    bytes_written = None

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self._tmux = ["tmux", "-L", f"console-nvitop-{name}", "-f", "/dev/null"]
        self._session = name
        subprocess.run([*self._tmux, "new-session", "-d", "-s", name, "-x", str(COLUMNS), "-y", str(LINES),
                        shlex.join(argv)], env=env, check=True)
        pane_pid, server_pid = self._tmux_output("display-message", "-p", "-t", name, "#{pane_pid} #{pid}").split()
        self.pid, self.tmux_server_pid = int(pane_pid), int(server_pid)

    def _tmux_output(self, *command: str) -> str:
        return subprocess.run([*self._tmux, *command], capture_output=True, text=True, check=True).stdout

    def alive(self) -> bool:
        return psutil.pid_exists(self.pid)

    def press_enter(self) -> None:
        self._tmux_output("send-keys", "-t", self._session, "Enter")

    def screen(self) -> bytes:
        return self._tmux_output("capture-pane", "-p", "-t", self._session).encode()

    @property
    def saw_gpu_name(self) -> bool:
        return any(name in self.screen() for name in GPU_NAMES)

    def stop(self) -> None:
        subprocess.run([*self._tmux, "kill-server"], check=False)


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) of every process in these trees, by pid."""
    seconds: dict[int, float] = {}
    for pid in pids:
        for process in process_tree(pid):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seconds[process.pid] = times.user + times.system
    return seconds


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for process in process_tree(pid):
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
    return total


@dataclasses.dataclass
class Group:
    """What one row of the result measures: the process trees rooted at these pids."""

    name: str
    pids: list[int]
    terminal: PtyTerminal | TmuxTerminal | None
    rss_samples: list[int] = dataclasses.field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(port: int, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"agentd not healthy on :{port} after {timeout_s} s") from None
            time.sleep(0.2)


def gpu_count() -> int | None:
    """GPUs NVML sees; None where NVML cannot run (then no per-GPU figures)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


def measure(groups: list[Group], seconds: float) -> dict[str, dict[str, float]]:
    """CPU per second, RSS and terminal bytes per second of each group over the window."""
    every = [pid for group in groups for pid in group.pids]
    before = cpu_seconds(every)
    written_before = {g.name: g.terminal.bytes_written for g in groups if g.terminal}  # None in tmux
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for group in groups:
            group.rss_samples.append(rss_bytes(group.pids))
        time.sleep(1.0)
    after = cpu_seconds(every)
    wall = time.monotonic() - start
    results = {}
    for group in groups:
        own = {p.pid for pid in group.pids for p in process_tree(pid)}
        used = sum(after[pid] - before.get(pid, 0.0) for pid in own if pid in after)
        row = {
            "cpu_per_s": used / wall,
            "rss_mean_mib": sum(group.rss_samples) / len(group.rss_samples) / 2**20,
            "rss_max_mib": max(group.rss_samples) / 2**20,
        }
        if group.terminal and group.terminal.bytes_written is not None:
            row["tty_bytes_per_s"] = (group.terminal.bytes_written - written_before[group.name]) / wall
        results[group.name] = row
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terminal", choices=("pty", "tmux"), default="pty")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--nvitop-path", required=True, help="where nvitop and its nvidia-ml-py are installed")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/.work/console_nvitop"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", COLUMNS=str(COLUMNS), LINES=str(LINES))
    nvitop_env = dict(env, PYTHONPATH=args.nvitop_path)
    port, metrics_port = free_port(), free_port()
    python = sys.executable
    with open(args.out / "agentd.log", "wb") as log:
        agentd = subprocess.Popen(
            [python, "-m", "agentd.cli", "--host", "127.0.0.1", "--port", str(port),
             "--metrics-port", str(metrics_port), "--interval-ms", "1000"],
            stdout=subprocess.DEVNULL, stderr=log, env=env,
        )
    def start(name: str, argv: list[str], viewer_env: dict[str, str]) -> PtyTerminal | TmuxTerminal:
        return TmuxTerminal(name, argv, viewer_env) if args.terminal == "tmux" else PtyTerminal(argv, viewer_env)

    terminals: dict[str, PtyTerminal | TmuxTerminal] = {}
    try:
        wait_healthy(metrics_port, 60)
        terminals["tuiprof"] = start("tuiprof", [python, "-m", "tuiprof.cli", "--interval", "1"], env)
        terminals["connect"] = start(
            "connect", [python, "-m", "tuiprof.cli", "connect", f"127.0.0.1:{port}", "--interval", "1"], env)
        terminals["nvitop"] = start(
            "nvitop", [python, "-m", "nvitop", "--monitor", "full", "--interval", "1"], nvitop_env)
        time.sleep(OPEN_HOST_AFTER_S)
        for name in ("tuiprof", "connect"):  # Enter on the one host: its GPU view, like nvitop's screen
            terminals[name].press_enter()
        time.sleep(max(0.0, args.warmup - OPEN_HOST_AFTER_S))
        for name, terminal in terminals.items():
            if not terminal.alive():
                sys.stderr.write(terminal.screen().decode(errors="replace")[-3000:])
                raise RuntimeError(f"{name} exited during the warm-up")
        groups = [
            Group("tuiprof (console + embedded agent, one process)", [terminals["tuiprof"].pid],
                  terminals["tuiprof"]),
            Group("tuiprof connect (console only)", [terminals["connect"].pid], terminals["connect"]),
            Group("agentd (for connect)", [agentd.pid], None),
            Group("tuiprof connect + agentd", [terminals["connect"].pid, agentd.pid], None),
            Group("nvitop --monitor full", [terminals["nvitop"].pid], terminals["nvitop"]),
        ]
        groups += [  # a tmux server's tree is its viewer and itself
            Group(f"{name} + its tmux server", [terminal.tmux_server_pid], None)
            for name, terminal in terminals.items() if terminal.tmux_server_pid
        ]
        rows = measure(groups, args.seconds)
        alive = {name: t.alive() for name, t in terminals.items()}
        screens = {name: t.screen() for name, t in terminals.items()}
        drew_gpu_name = {name: t.saw_gpu_name for name, t in terminals.items()}
    finally:
        for terminal in terminals.values():
            terminal.stop()
        agentd.terminate()
        agentd.wait(10)
    for name, screen in screens.items():
        (args.out / f"{name}.{args.terminal}").write_bytes(screen)
    gpus = gpu_count()
    if gpus:
        for row in rows.values():
            row["cpu_ms_per_s_per_gpu"] = row["cpu_per_s"] * 1000 / gpus
            row["rss_mean_mib_per_gpu"] = row["rss_mean_mib"] / gpus
    result = {
        "gpus": gpus, "seconds": args.seconds, "warmup": args.warmup, "cpus": os.cpu_count(),
        "terminal": f"{COLUMNS}x{LINES} {args.terminal}", "alive_at_end": alive,
        "drew_gpu_name": drew_gpu_name,
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    (args.out / "result.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
