"""libkineto's event-config requests, with real PyTorch (CPU) polling a real endpoint.

A real libkineto polls with type EVENTS|ACTIVITIES (3) and, while an activity trace
runs, with EVENTS (1) only (the test sees both). dynolog answers EVENTS with the event config stored for the process,
and its RPC stores only activity configs (setKinetOnDemandRequest is always
ACTIVITIES), so the event part of every answer is empty; an activity config
waits while the process's activity profiler is busy. agentd answers the same.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from agentd.kineto.endpoint import KinetoEndpoint
from agentd.kineto.registry import PendingConfig, Registry
from testkit.traces import trainers

pytestmark = pytest.mark.slow
WAIT_SECONDS = 60.0


class RecordingRegistry(Registry):
    """The real registry, remembering whether each poll asked for activities (type bit 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_activities: list[bool] = []

    def poll(self, job_id: int, pids: tuple[int, ...], host_pid: int, uid: int,
             wants_activities: bool, pid_in_namespace: int | None = None) -> PendingConfig | None:
        self.asked_activities.append(wants_activities)
        return super().poll(job_id, pids, host_pid, uid, wants_activities, pid_in_namespace)


@pytest.fixture
def socket_dir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="tpe", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_event_polls_get_an_empty_config_and_an_activity_config_waits_for_an_activities_poll(socket_dir):
    registry = RecordingRegistry()
    endpoint = KinetoEndpoint(registry, str(socket_dir))
    try:
        with trainers(socket_dir, [None]):
            wait_for(lambda: registry.entries(), "the trainer's first poll")
            [entry] = registry.entries()
            assert registry.asked_activities[0] is True  # type 3: events and activities
            trace = socket_dir / "trace.json"
            first = PendingConfig(f"ACTIVITIES_DURATION_MSECS=3000\nACTIVITIES_LOG_FILE={trace}\n")
            registry.offer(entry, first)
            wait_for(lambda: first.delivered_at is not None, "the activity config to be taken")
            wait_for(lambda: registry.entries()[0].profiler_busy, "an events-only poll while the trace runs")
            second = PendingConfig(f"ACTIVITIES_DURATION_MSECS=500\nACTIVITIES_LOG_FILE={socket_dir / 'next.json'}\n")
            registry.offer(registry.entries()[0], second)
            busy_polls = registry.asked_activities.count(False)
            wait_for(lambda: registry.asked_activities.count(False) > busy_polls, "another events-only poll")
            assert second.delivered_at is None  # an events-only poll gets the (empty) event config only
            wait_for(lambda: second.delivered_at is not None, "the next activities poll after the trace")
            wait_for(lambda: any(socket_dir.glob("trace*.json")), "libkineto to write the first trace")
    finally:
        endpoint.close()
    assert registry.asked_activities.count(False) >= 2  # the events-only polls really came from libkineto
