"""The cluster view from Prometheus: one PromQL instant query per figure, aggregated by the server.

``figures``: what is asked (the hosts a view covers, one record per figure of a row, the hang
query); ``http``: Prometheus's HTTP API; ``fleet``: one refresh's answers turned into rows;
``events``: the rows as the console's host events, and hosts drilled into watched over gRPC.
The names the commands, screens, benches and tests use are re-exported here.
"""

from tuiprof.client.prometheus.events import (
    DEFAULT_REFRESH_S, NO_RANKS, NO_VIEW_YET, FleetEvents, PrometheusSource,
)
from tuiprof.client.prometheus.figures import (
    FIGURES, HANG_HOSTS_NAMED, RULES_PROBE, SERVER_TIME, HostSelection, column_queries, hang_query,
)
from tuiprof.client.prometheus.fleet import (
    NOT_RECORDED_YET, NOT_SCRAPED, SETTLED_AFTER_S, FleetView, HostRow, fetch_fleet, hang_statuses,
    recording_rules_loaded,
)
from tuiprof.client.prometheus.http import PrometheusClient, QueryResult

__all__ = [
    "DEFAULT_REFRESH_S", "FIGURES", "HANG_HOSTS_NAMED", "NOT_RECORDED_YET", "NOT_SCRAPED", "NO_RANKS", "NO_VIEW_YET",
    "RULES_PROBE", "SERVER_TIME", "SETTLED_AFTER_S", "FleetEvents", "FleetView", "HostRow", "HostSelection",
    "PrometheusClient", "PrometheusSource", "QueryResult", "column_queries", "fetch_fleet", "hang_query",
    "hang_statuses", "recording_rules_loaded",
]
