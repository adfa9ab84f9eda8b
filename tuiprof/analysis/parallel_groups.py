"""Where each rank sits in the job's parallel groups (tensor, context, expert, data, pipeline).

Two sources, as xpu-timer's timeline generator has: a ``--groups`` layout such as
``tp4-cp2-dp4-pp2`` (Megatron's order: the first dimension varies fastest, so
rank = tp + 4 * (cp + 2 * (dp + 4 * pp)); xpu-timer's default priority is
``tp-cp-dp-pp``), or the process groups the ranks report (Kineto's
``distributedInfo.pg_config``, which also names what the Flight Recorder's
``pg_config`` names). From process groups, every group that is neither the world
nor one rank is put in a dimension: groups of one size and description, split
into partitions of the world in the order they were made (the pairs [0,1] and
[2,3], made first, are one dimension, [0,2] and [1,3] the next). A dimension
takes its name from the description when that says which (``tp``, ``mesh_dp``,
Megatron's ``TENSOR_MODEL_PARALLEL_GROUP`` …), else it is ``group1``, ``group2`` ….

A rank's coordinate along a dimension is its place among its group's ranks in
rank order: with ``tp4-dp2``, rank 6 is the third of its tp group [4..7] and the
second of its dp group [2, 6], so ``tp2 dp1``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from agentd.traces.analysis.process_groups import ProcessGroup
from tuiprof.errors import BadInputError

KNOWN_DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")  # also the order dimensions found in process groups take
_SPEC_PART = re.compile(r"([a-z]+)(\d+)")
# What a process group's description says of its dimension, once lowercased and stripped of "mesh_" (DeviceMesh)
# and "_model_parallel_group" / "_parallel_group" / "_group" (Megatron's names).
_DESCRIPTION_NAMES = {"tp": "tp", "tensor": "tp", "cp": "cp", "context": "cp", "ep": "ep", "expert": "ep",
                      "dp": "dp", "data": "dp", "pp": "pp", "pipeline": "pp"}
_DESCRIPTION_NOISE = re.compile(r"^mesh_|(_model)?(_parallel)?_group$")
_UNINFORMATIVE_DESCRIPTIONS = frozenset({"", "undefined", "default_pg"})


class GroupsSpecError(BadInputError):
    """A ``--groups`` layout that cannot be this job's: the message says what is wrong and what is expected."""


@dataclass(frozen=True)
class Dimension:
    name: str
    size: int


@dataclass(frozen=True)
class GroupLayout:
    """The job's dimensions (fastest-varying first), each rank's coordinates, and where they came from."""

    dimensions: tuple[Dimension, ...]
    coordinates: Mapping[int, Mapping[str, int]]  # rank -> dimension name -> its place in that dimension's group
    source: str  # "--groups tp2-dp2" or "process groups"

    def describe(self) -> str:
        sizes = (f"{d.name}{d.size}" if d.name in KNOWN_DIMENSIONS else f"{d.name}({d.size})" for d in self.dimensions)
        return "-".join(sizes) + f" (from {self.source})"

    def label(self, rank: int) -> str:
        """``tp1 dp0 (rank 1)``: the rank's coordinates, outermost dimension last as in the spec."""
        coordinates = self.coordinates.get(rank, {})
        parts = [_coordinate(d.name, coordinates[d.name]) for d in self.dimensions if d.name in coordinates]
        return " ".join([*parts, f"(rank {rank})"])

    def sort_key(self, rank: int) -> tuple[int, ...]:
        """Ranks in layout order: outermost dimension first, so one innermost group (tp) sits together."""
        coordinates = self.coordinates.get(rank, {})
        return (*(coordinates.get(d.name, -1) for d in reversed(self.dimensions)), rank)

    def peers(self, rank: int, dimension: str) -> tuple[int, ...] | None:
        """Which group of ``dimension`` the rank is in: its coordinates along every other dimension (None: the
        rank has no place along ``dimension``)."""
        coordinates = self.coordinates.get(rank, {})
        if dimension not in coordinates:
            return None
        return tuple(coordinates.get(d.name, -1) for d in self.dimensions if d.name != dimension)


def _coordinate(name: str, value: int) -> str:
    return f"{name}{value}" if name in KNOWN_DIMENSIONS else f"{name}={value}"


def parse_groups(spec: str) -> tuple[Dimension, ...]:
    """``tp4-cp2-dp4-pp2`` as its dimensions, first (fastest-varying) first; refuses what is not that form."""
    dimensions: list[Dimension] = []
    for part in spec.split("-"):
        match = _SPEC_PART.fullmatch(part.strip().lower())
        if match is None:
            raise GroupsSpecError(f"--groups {spec!r}: {part!r} is not a dimension and its size; write them as "
                                  f"tp4-cp2-dp4-pp2 (dimensions: {', '.join(KNOWN_DIMENSIONS)})")
        name, size = match.group(1), int(match.group(2))
        if name not in KNOWN_DIMENSIONS:
            raise GroupsSpecError(f"--groups {spec!r}: unknown dimension {name!r}; "
                                  f"known: {', '.join(KNOWN_DIMENSIONS)}")
        if size < 1:
            raise GroupsSpecError(f"--groups {spec!r}: {name} has size 0; every size is 1 or more")
        if any(d.name == name for d in dimensions):
            raise GroupsSpecError(f"--groups {spec!r}: {name} is given twice")
        dimensions.append(Dimension(name, size))
    return tuple(dimensions)


def layout_from_spec(dimensions: tuple[Dimension, ...], world_size: int, spec: str) -> GroupLayout:
    """Each rank's coordinates under the ``--groups`` layout; refuses a layout whose sizes do not multiply to
    the job's world size."""
    product = math.prod(d.size for d in dimensions)
    if product != world_size:
        raise GroupsSpecError(f"--groups {spec}: the sizes multiply to {product}, but the job has {world_size} "
                              "ranks; give sizes whose product is the world size")
    coordinates: dict[int, dict[str, int]] = {}
    for rank in range(world_size):
        rest, place = rank, {}
        for dimension in dimensions:
            rest, place[dimension.name] = divmod(rest, dimension.size)
        coordinates[rank] = place
    return GroupLayout(dimensions, coordinates, f"--groups {spec}")


def layout_from_process_groups(groups_by_rank: Mapping[int, list[ProcessGroup]], world_size: int
                               ) -> GroupLayout | None:
    """The dimensions the ranks' process groups make (None: they make none: only the world, or no groups)."""
    seen: dict[tuple[int, ...], ProcessGroup] = {}
    for groups in groups_by_rank.values():
        for group in groups:
            if 1 < len(group.ranks) < world_size:
                seen.setdefault(group.ranks, group)
    families: dict[tuple[str, int], list[list[ProcessGroup]]] = {}  # (description, size) -> its partitions
    for group in sorted(seen.values(), key=_made_order):
        partitions = families.setdefault((group.description, len(group.ranks)), [])
        home = next((p for p in partitions if not any(set(group.ranks) & set(q.ranks) for q in p)), None)
        if home is None:
            partitions.append([group])
        else:
            home.append(group)
    named = [(_dimension_name(description), partition) for (description, _), partitions in families.items()
             for partition in partitions]
    if not named:
        return None
    known = sorted((item for item in named if item[0] in KNOWN_DIMENSIONS), key=lambda item: KNOWN_DIMENSIONS.index(item[0]))
    generic = [item for item in named if item[0] not in KNOWN_DIMENSIONS]
    dimensions: list[Dimension] = []
    coordinates: dict[int, dict[str, int]] = {}
    taken: set[str] = set()
    for index, (name, partition) in enumerate([*known, *generic], start=1):
        name = name or f"group{index}"
        name = name if name not in taken else f"{name}{index}"
        taken.add(name)
        dimensions.append(Dimension(name, len(partition[0].ranks)))
        for group in partition:
            for place, rank in enumerate(group.ranks):
                coordinates.setdefault(rank, {})[name] = place
    return GroupLayout(tuple(dimensions), coordinates, "process groups")


def _made_order(group: ProcessGroup) -> tuple[int, str]:
    """PyTorch names groups by a counter, in the order they were made ("0" the world, "1" …); others after."""
    return (int(group.name), "") if group.name.isdigit() else (1 << 62, group.name)


def _dimension_name(description: str) -> str:
    """The dimension a description names ("" when it names none that this knows and says nothing else)."""
    lowered = description.lower()
    if lowered in _UNINFORMATIVE_DESCRIPTIONS:
        return ""
    stripped = _DESCRIPTION_NOISE.sub("", lowered)
    return _DESCRIPTION_NAMES.get(stripped, re.sub(r"\W+", "_", lowered))
