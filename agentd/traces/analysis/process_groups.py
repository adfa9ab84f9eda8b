"""A rank's process groups as its trace lists them, and which of them each gloo collective ran on.

Kineto's ``distributedInfo.pg_config`` lists the rank's process groups in the order it made them
(``torch.distributed``'s ``pg_map``). NCCL's spans name their communicator; gloo's do not. In PyTorch 2.13
(and in the 2024 gloo trace of tests/traces/data/corpus) a ``gloo:all_reduce`` span, on the group's worker
thread, carries the op's input shapes only;
the ``c10d::allreduce_`` op that enqueued it on the main thread records no process group (the argument is
not a tensor or scalar), no sequence number, and no ``record_param_comms`` span (only NCCL and other GPU
backends record one); no flow event joins the two, and their ``External id``s are per-thread blocks of the
profiler's own. What says which group a gloo call ran on is the thread that ran it:

- each ``ProcessGroupGloo`` starts its own worker threads when it is made (``pt_gloo_runloop``; two per
  network device: one device unless ``GLOO_SOCKET_IFNAME`` lists several), and they serve that group alone;
- Linux gives a process's new threads increasing ids (until the ids wrap at ``pid_max``, millions on current
  systems), so in id order a rank's worker threads come group by group, in the order the rank made them.

So when a rank's trace shows ``workers`` threads for each of its gloo groups, the first ``workers`` in id
order serve the first group it made, the next ones the next group, and so on: every gloo call is named. That
is the usual case: a group's calls take turns on its threads, so two calls of each group in the window show
them all. A thread that ran nothing in the window is not in the trace, and then where each group's threads
begin is not known (whichever thread is missing, every group's first or last thread could be its
neighbour's): such a rank's gloo calls are named only when it has one gloo group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import msgspec

from agentd.traces.analysis.extract import CollectiveCall

GLOO_WORKERS_PER_DEVICE = 2  # ProcessGroupGloo's worker threads: options.threads = 2 * its devices


@dataclass(frozen=True)
class ProcessGroup:
    """One process group as a rank reports it: its name (the communicator's id), description and ranks, and
    whether gloo serves it (its backend config names gloo, or the trace does not say)."""

    name: str
    description: str
    ranks: tuple[int, ...]  # () when the trace does not list them as numbers
    gloo: bool = True


class _ReportedGroup(msgspec.Struct):
    pg_name: str = ""
    pg_desc: str = ""
    ranks: list[int] | str = []  # some PyTorch versions write a string
    backend_config: str | None = None  # "cpu:gloo,cuda:nccl"


_decode_groups = msgspec.json.Decoder(list[_ReportedGroup]).decode


def process_groups(pg_config: msgspec.Raw) -> list[ProcessGroup]:
    """A trace's ``distributedInfo.pg_config``, the groups it lists in the order the rank made them ([]: none, or
    not in a form this reads)."""
    try:
        reported = _decode_groups(pg_config)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    return [ProcessGroup(g.pg_name, g.pg_desc, tuple(sorted(g.ranks)) if isinstance(g.ranks, list) else (),
                         g.backend_config is None or "gloo" in g.backend_config) for g in reported]


def gloo_thread_groups(threads: Iterable[int], groups: list[ProcessGroup]) -> dict[int, str]:
    """Which gloo group each of a rank's worker threads serves: thread id -> group name (empty: it cannot be
    told; see the module's docstring).

    ``workers`` (a group's threads) is two per device: more than two a group on the rank mean more devices,
    and raise it to the next even number that holds them.
    """
    served = [group for group in groups if group.gloo]
    ordered = sorted(set(threads))
    if len(served) == 1:
        return dict.fromkeys(ordered, served[0].name)
    if not served or not ordered:
        return {}
    workers = GLOO_WORKERS_PER_DEVICE * math.ceil(len(ordered) / (len(served) * GLOO_WORKERS_PER_DEVICE))
    if len(ordered) != workers * len(served):
        return {}
    return {thread: served[place // workers].name for place, thread in enumerate(ordered)}


def name_gloo_calls(calls: list[CollectiveCall], groups: list[ProcessGroup], unknown: str
                    ) -> list[CollectiveCall]:
    """The rank's calls, each gloo call (a CPU call with no group of its own) given the group its worker thread
    serves (``gloo_thread_groups``).

    A call whose group cannot be told gets ``unknown``, a group of the rank's own (``?@<rank>``), as an
    unmatched call gets an occurrence of its own: it is linked to nothing, rather than to another group's
    call numbered alike. A trace that lists no groups keeps the one unnamed group (its calls are paired by
    order across ranks, as before PyTorch listed its groups).
    """
    def unnamed(call: CollectiveCall) -> bool:
        return not call.group and not call.on_gpu

    if not groups or not any(map(unnamed, calls)):
        return calls
    served = gloo_thread_groups((call.tid for call in calls if unnamed(call) and isinstance(call.tid, int)), groups)
    return [replace(call, group=served.get(call.tid, unknown) if isinstance(call.tid, int) else unknown)
            if unnamed(call) else call for call in calls]
