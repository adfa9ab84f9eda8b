"""What the agent can learn about a polling process from /proc: its rank and whether it runs CUDA.

Both files are readable only for the agent's own user or root; when they are
not, the rank stays unknown and the process is treated as CPU-only.
"""

from __future__ import annotations

from dataclasses import dataclass

# Launchers set one of these; torchrun's RANK wins.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
# A process with any of these mapped can produce GPU activities.
CUDA_LIBRARIES = ("libcudart", "libtorch_cuda", "libcupti")


@dataclass(frozen=True)
class ProcessFacts:
    rank: int | None
    cuda: bool
    alive: bool


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def rank_from_environ(env: dict[str, str]) -> int | None:
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def uses_cuda(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return False
    return any(name in maps for name in CUDA_LIBRARIES)


def process_facts(pid: int) -> ProcessFacts:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        alive = state not in (b"Z", b"X")
    except (OSError, IndexError):
        alive = False
    return ProcessFacts(rank_from_environ(read_environ(pid)), uses_cuda(pid), alive)
