"""Which collectors agentd runs: one line per collector.

Each entry is ``"module:factory"``; the factory is called with the collector
interval in seconds and returns a ``Collector``. A collector whose module cannot
be imported (a missing optional dependency, an extension not built) is reported
unavailable with the import error as its reason; the agent runs on without it.
"""

from __future__ import annotations

COLLECTORS: tuple[str, ...] = (
    "agentd.collectors.host:HostCollector",
    "agentd.collectors.gpu:GpuCollector",
    "agentd.collectors.pmu:PmuCollector",
    "agentd.collectors.ranks:RanksCollector",
)
