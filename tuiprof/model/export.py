"""The ``status --json`` document: one object per host, unreachable hosts included."""

from __future__ import annotations

from typing import Any

from tuiprof.model import convert
from tuiprof.model.cluster import ClusterState, HostState

SNAPSHOT_SECTIONS = ("cpu", "memory", "nics", "disks", "gpus", "pmu", "ranks", "hang", "collectors")


def host_document(state: HostState) -> dict[str, Any]:
    """``host``, ``reachable``, ``error``, ``last_contact_unix``, ``info``, ``summary`` and
    the snapshot's fields (``hostname``, ``timestamp_unix_ns``, ``sequence``, ``cpu`` …);
    sections are null when the host never sent a snapshot."""
    document: dict[str, Any] = {
        "host": state.address,
        "reachable": bool(state.reachable),
        "error": state.error or None,
        "last_contact_unix": state.last_contact,
        "info": state.info.to_json() if state.info else None,
        "summary": convert.to_json(state.summary) if state.summary else None,
    }
    if state.snapshot is not None:
        document |= state.snapshot.to_json()
    else:
        document |= {"hostname": None, "timestamp_unix_ns": None, "sequence": None}
        document |= dict.fromkeys(SNAPSHOT_SECTIONS)
    return document


def cluster_document(cluster: ClusterState) -> dict[str, Any]:
    return {"hosts": [host_document(state) for state in cluster.hosts()]}
