"""Merged stack trees to and from the wire (``pb.StackNode``, ``pb.RankStacks``)."""

from __future__ import annotations

from collections.abc import Iterable

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks import ranksets
from agentd.stacks.merge import Frame, MergedStacks, Node, ThreadSample, normalize_frames
from agentd.stacks.collectives import Inflight, RankCollectives
from agentd.text import printable


def samples_from_ranks(ranks: Iterable[pb.RankStacks]) -> list[ThreadSample]:
    """Thread samples of the ranks that have a rank number and stacks.

    A process without a rank number is left to the console, which merges every host's
    and alone can give it a bit no rank of the job has (``thread_samples``)."""
    samples = []
    for rank in ranks:
        if rank.HasField("rank") and rank.rank >= 0:
            samples.extend(thread_samples(rank.rank, rank))
    return samples


def thread_samples(member: int, process: pb.RankStacks) -> list[ThreadSample]:
    """The threads of ``process`` as samples of the tree member ``member`` (its rank, or the bit given it)."""
    return [ThreadSample(member, printable(thread.thread_name), normalize_frames(thread.frames))
            for thread in process.threads]


def tree_to_proto(merged: MergedStacks) -> pb.StackNode:
    root = pb.StackNode(ranks=ranksets.ranks_of(merged.ranks))
    for thread, node in sorted(merged.threads.items()):
        group = root.children.add(thread=thread)
        _node_to_proto(node, group)
    return root


def _node_to_proto(node: Node, out: pb.StackNode) -> None:
    pending = [(node, out)]
    while pending:
        source, target = pending.pop()
        target.ranks.extend(ranksets.ranks_of(source.ranks))
        if source.frame is not None:
            f = source.frame
            target.frame.CopyFrom(pb.Frame(function=f.function, file=f.file, line=f.line, native=f.native))
        for child in source.children.values():
            pending.append((child, target.children.add()))


class TreeFormatError(ValueError):
    """A StackNode tree that does not have the merged-tree shape."""


def tree_from_proto(root: pb.StackNode) -> MergedStacks:
    merged = MergedStacks(ranks=ranksets.mask_of(root.ranks))
    for group in root.children:
        if not group.thread:
            raise TreeFormatError(
                "a child of the merged root has no thread name; expected one thread group per child"
            )
        node = merged.root(printable(group.thread))
        pending = [(group, node)]
        while pending:
            source, target = pending.pop()
            target.ranks |= ranksets.mask_of(source.ranks)
            for child in source.children:
                f = child.frame
                frame = Frame(printable(f.function), printable(f.file), f.line, f.native)  # another agent's text
                pending.append((child, target.child(frame)))
        merged.ranks |= node.ranks
    return merged


COLLECTIVE_KINDS = ("nccl", "fr")  # in-flight kinds that are collectives: the NCCL plugin, Flight Recorder


def collectives_from_ranks(ranks: Iterable[pb.RankStats]) -> list[RankCollectives]:
    """The collectives each rank has in flight and the communicators it belongs to: NCCL
    communicators it used, and (Flight Recorder) process groups as "pg<id>"."""
    out = []
    for rank in ranks:
        if not rank.HasField("rank") or rank.rank < 0:
            continue
        inflight = tuple(
            Inflight(op.op, op.comm_hash, op.sequence, op.age_seconds)
            for op in rank.inflight if op.kind in COLLECTIVE_KINDS
        )
        comms = frozenset(s.comm_hash for s in rank.nccl if s.comm_hash) | {f"pg{g.id}" for g in rank.process_groups}
        out.append(RankCollectives(rank.rank, inflight, comms))
    return out
