"""Merged stack trees across ranks (STAT's trace/space prefix tree).

Every rank contributes one stack per thread group (threads grouped by name).
Stacks are merged into one prefix tree per thread group; each node holds the
bit mask of the ranks whose stack passes through it, so the ranks that did
*not* reach it are the complement within the merge. Ranks whose stacks end at
the same node form an equivalence class; the smallest classes are where the
odd rank hides. Pure functions, no I/O: the agent pre-merges its local ranks,
the console merges the hosts' trees, and both produce the same tree as merging
every raw stack at once (merging is associative and order-independent).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from agentd.stacks import ranksets
from agentd.text import printable

MAIN_THREAD = "MainThread"


class Frame(NamedTuple):
    """A normalized frame: what identifies it in the tree (line 0 = not used)."""

    function: str
    file: str
    line: int = 0
    native: bool = False

    def label(self) -> str:
        """``func (file.py:12)`` for Python frames, ``func [libfoo.so]`` for native ones."""
        if self.native:
            return f"{self.function} [{self.file}]" if self.file else self.function
        where = os.path.basename(self.file)
        if self.line:
            where = f"{where}:{self.line}"
        return f"{self.function} ({where})" if where else self.function


class RawFrame(Protocol):
    """What a frame looks like before normalization (``pb.Frame`` fits)."""

    function: str
    file: str
    line: int
    native: bool
    module: str


@dataclass(frozen=True)
class ThreadSample:
    """One thread's stack of one rank, outermost frame first."""

    rank: int
    thread: str
    frames: tuple[Frame, ...]


class Node:
    """A frame in the merged tree and the ranks whose stacks pass through it."""

    __slots__ = ("frame", "ranks", "children")

    def __init__(self, frame: Frame | None) -> None:
        self.frame = frame
        self.ranks = 0
        self.children: dict[Frame, Node] = {}

    def child(self, frame: Frame) -> Node:
        node = self.children.get(frame)
        if node is None:
            node = self.children[frame] = Node(frame)
        return node

    def ending(self) -> int:
        """The ranks whose stack ends at this node (in no child)."""
        below = 0
        for child in self.children.values():
            below |= child.ranks
        return self.ranks & ~below

    def sorted_children(self) -> list[Node]:
        """Children with the most ranks first, then by label (a stable display order)."""
        return [node for _, node in self.sorted_items()]

    def sorted_items(self) -> list[tuple[Frame, Node]]:
        """``(frame, child)`` in the order of ``sorted_children``."""
        return sorted(self.children.items(), key=lambda item: (-item[1].ranks.bit_count(), item[0].label()))


@dataclass
class MergedStacks:
    """One prefix tree per thread group; ``ranks`` is every rank that contributed.

    ``unranked``: the bits that stand for processes without a rank number, and their
    names (``pid 4242``); see :mod:`agentd.stacks.ranksets`."""

    threads: dict[str, Node] = field(default_factory=dict)
    ranks: int = 0
    unranked: dict[int, str] = field(default_factory=dict)

    def root(self, thread: str) -> Node:
        node = self.threads.get(thread)
        if node is None:
            node = self.threads[thread] = Node(None)
        return node

    def main_thread(self) -> str | None:
        """``MainThread`` when present, else the thread group most ranks have."""
        if MAIN_THREAD in self.threads:
            return MAIN_THREAD
        if not self.threads:
            return None
        return min(self.threads, key=lambda name: (-self.threads[name].ranks.bit_count(), name))

    def missing(self, node: Node) -> int:
        """The ranks of this merge that did not reach ``node``."""
        return self.ranks & ~node.ranks


# ---------------------------------------------------------------- normalization

# Interpreter plumbing between two Python frames: it says nothing about where a
# rank is, and it differs between Python builds, so it would split classes.
_INTERPRETER = re.compile(
    r"^(_?PyEval_\w+|_?PyFunction_\w+|_?PyObject_\w*Call\w*|_?PyVectorcall_\w+|"
    r"_?PyCFunction_\w+|cfunction_\w+|method_vectorcall\w*|vectorcall_\w+|slot_tp_\w+|"
    r"_?PyRun_\w+|PyRun_\w+|run_mod|run_eval_code_obj|pymain_\w+|Py_RunMain|Py_BytesMain|"
    r"Py_Main|thread_run|t_bootstrap|_?Py_?[Ii]nvoke\w*|call_function|do_call_core|"
    r"_PyCode_\w+|builtin_exec\w*|_start|__libc_start\w*|start_thread|clone3?)$"
)
_ADDRESS = re.compile(r"^(0x[0-9a-fA-F]+|\?\?+|\[?unknown\]?)$")
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
UNKNOWN = "??"


def normalize_frames(frames: Iterable[RawFrame]) -> tuple[Frame, ...]:
    """Frames (outermost first) as tree keys: addresses stripped, interpreter frames dropped.

    An unsymbolized native frame becomes ``??`` in its library, and a run of
    them in the same library is one frame: their addresses differ between
    processes but mean the same thing.
    """
    out: list[Frame] = []
    for raw in frames:
        function = _OFFSET.sub("", printable(raw.function).strip()) or UNKNOWN
        if raw.native:
            if _INTERPRETER.match(function):
                continue
            if _ADDRESS.match(function):
                function = UNKNOWN
            library = os.path.basename(printable(raw.module or raw.file))
            frame = Frame(function, library, 0, True)
            if function == UNKNOWN and out and out[-1] == frame:
                continue
        else:
            frame = Frame(function, printable(raw.file), max(raw.line, 0), False)
        out.append(frame)
    return tuple(out)


def without_lines(frame: Frame) -> Frame:
    return frame._replace(line=0) if frame.line else frame


# ---------------------------------------------------------------- merging

def merge(samples: Iterable[ThreadSample]) -> MergedStacks:
    """Merge raw stacks into one tree per thread group.

    A rank with two threads of the same name gets ``name [2]`` for the second
    (in input order), so that every rank has at most one stack per group.
    """
    merged = MergedStacks()
    seen: dict[tuple[int, str], int] = {}
    for sample in samples:
        if sample.rank < 0:
            raise ranksets.RankSetError(f"rank {sample.rank} is negative; ranks are 0 or more")
        bit = 1 << sample.rank
        copies = seen[(sample.rank, sample.thread)] = seen.get((sample.rank, sample.thread), 0) + 1
        thread = sample.thread if copies == 1 else f"{sample.thread} [{copies}]"
        merged.ranks |= bit
        node = merged.root(thread)
        node.ranks |= bit
        for frame in sample.frames:
            node = node.child(frame)
            node.ranks |= bit
    return merged


def merge_trees(trees: Iterable[MergedStacks]) -> MergedStacks:
    """Merge already-merged trees (e.g. one per host) into one."""
    merged = MergedStacks()
    for tree in trees:
        merged.ranks |= tree.ranks
        merged.unranked.update(tree.unranked)
        for thread, root in tree.threads.items():
            _merge_into(merged.root(thread), root)
    return merged


def _merge_into(target: Node, source: Node) -> None:
    pending = [(target, source)]
    while pending:
        into, node = pending.pop()
        into.ranks |= node.ranks
        for frame, child in node.children.items():
            pending.append((into.child(frame), child))


def project(merged: MergedStacks, *, lines: bool, native: bool) -> MergedStacks:
    """The tree as it would have been merged with coarser frames.

    ``lines=False`` merges frames that differ only by line number; ``native=False``
    drops native frames (their callees move up to the nearest Python frame).
    Equal to merging the projected raw stacks, so the console can toggle
    without asking the agents again.
    """
    out = MergedStacks(ranks=merged.ranks, unranked=merged.unranked)
    for thread, root in merged.threads.items():
        new_root = out.root(thread)
        new_root.ranks = root.ranks
        pending = [(root, new_root)]
        while pending:
            node, into = pending.pop()
            for frame, child in node.children.items():
                if frame.native and not native:
                    pending.append((child, into))
                    continue
                target = into.child(frame if lines else without_lines(frame))
                target.ranks |= child.ranks
                pending.append((child, target))
    return out


# ---------------------------------------------------------------- classes and suspects

@dataclass(frozen=True)
class EquivalenceClass:
    """Ranks whose stacks (of one thread group) are identical."""

    thread: str
    ranks: int
    frames: tuple[Frame, ...]

    @property
    def count(self) -> int:
        return self.ranks.bit_count()

    @property
    def leaf(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    def where(self) -> str:
        """The innermost Python frame (where the rank's own code is), else the leaf."""
        for frame in reversed(self.frames):
            if not frame.native:
                return frame.label()
        return self.leaf.label() if self.leaf else "(empty stack)"


def walk(root: Node) -> Iterator[tuple[tuple[Frame, ...], Node]]:
    """Every node under ``root`` with its path (outermost first), depth first."""
    pending: list[tuple[tuple[Frame, ...], Node]] = [((), root)]
    while pending:
        path, node = pending.pop()
        yield path, node
        for frame, child in reversed(node.sorted_items()):
            pending.append((path + (frame,), child))


def equivalence_classes(merged: MergedStacks, thread: str | None = None) -> list[EquivalenceClass]:
    """Distinct stacks of ``thread`` (default: the main thread), smallest class first."""
    thread = thread or merged.main_thread()
    if thread is None or thread not in merged.threads:
        return []
    classes = [
        EquivalenceClass(thread, ending, path)
        for path, node in walk(merged.threads[thread])
        if (ending := node.ending())
    ]
    classes.sort(key=lambda c: (c.count, ranksets.ranks_of(c.ranks)[0]))
    return classes


@dataclass(frozen=True)
class Suspect:
    ranks: int
    reason: str


def find_suspects(
    classes: list[EquivalenceClass], collective_findings: dict[int, str] | None = None, behind: int = 0,
    unranked: dict[int, str] | None = None,
) -> list[Suspect]:
    """The odd ranks out, each with an explanation.

    Direct evidence first: ranks that the collectives show ``behind`` (a mask:
    they never launched a collective others launched, see
    :mod:`agentd.stacks.collectives`) are the suspects, class by
    class, whatever the class sizes (with 2 ranks, or half the job stuck, the
    sizes alone cannot say). Otherwise the ranks in classes smaller than the
    largest one: nothing is odd, so no suspect is named, when there is one
    class (everyone waits in the same place), when the classes are of equal
    size, or when the smaller classes together hold half the ranks or more
    (ranks spread over many places). ``collective_findings`` (rank → sentence)
    is prefixed to the stack evidence; ``unranked`` names the processes without a rank number.
    """
    if len(classes) < 2:
        return []
    lagging = [c for c in classes if not c.ranks & ~behind]
    if lagging and len(lagging) < len(classes):
        return _explain([c for c in classes if c not in lagging], lagging, collective_findings or {}, unranked)
    largest = max(c.count for c in classes)
    majority = [c for c in classes if c.count == largest]
    odd_ranks = sum(c.count for c in classes if c.count < largest)
    if len(majority) == len(classes) or 2 * odd_ranks >= sum(c.count for c in classes):
        return []
    return _explain(majority, [c for c in classes if c.count < largest], collective_findings or {}, unranked)


def _explain(
    majority: list[EquivalenceClass], odd: list[EquivalenceClass], findings: dict[int, str],
    unranked: dict[int, str] | None,
) -> list[Suspect]:
    """One suspect per odd class, saying where it is and where the others are."""
    others = " and ".join(
        f"{ranksets.who(c.ranks, unranked)} {'is' if c.count == 1 else 'are'} in `{c.where()}`" for c in majority
    )
    suspects = []
    for cls in odd:
        label = ranksets.who(cls.ranks, unranked)
        collective = _shared_finding(cls.ranks, findings)
        verb = "it is" if cls.count == 1 else "they are"
        if collective:
            reason = f"{label} {collective}; {verb} in `{cls.where()}` ({others})"
        else:
            reason = f"{label} {'is' if cls.count == 1 else 'are'} in `{cls.where()}`; {others}"
        suspects.append(Suspect(cls.ranks, reason))
    return suspects


def _shared_finding(mask: int, findings: dict[int, str]) -> str | None:
    """The collective finding all ranks of ``mask`` share, if they share one."""
    texts = {findings.get(rank) for rank in ranksets.ranks_of(mask)}
    return texts.pop() if len(texts) == 1 else None
