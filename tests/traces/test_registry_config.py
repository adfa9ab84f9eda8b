"""The Kineto registry (matching, hand-out rules, expiry) and the config text libkineto parses."""

from __future__ import annotations

import logging
import time

import pytest

from agentd.kineto.registry import MAX_ENTRIES_PER_UID, BusyError, PendingConfig, Registry, RegistryFullError
from agentd.kineto import config as kineto_config


def registry_with_job() -> Registry:
    registry = Registry()
    registry.poll(7, (300, 200, 100), 300, 1000, True)  # rank under torchrun 200 under shell 100
    registry.poll(7, (301, 200, 100), 301, 1000, True)
    registry.poll(7, (200, 100), 200, 1000, True)  # the launcher itself polls too
    registry.poll(8, (400, 100), 400, 1000, True)
    return registry


def test_match_by_job_and_ancestry_with_leaves_first():
    registry = registry_with_job()
    assert [e.host_pid for e in registry.match("7", set())] == [300, 301, 200]
    assert [e.host_pid for e in registry.match("7", {200})] == [300, 301, 200]  # the launcher's children too
    assert [e.host_pid for e in registry.match("", {301})] == [301]
    assert [e.host_pid for e in registry.match("", {100})] == [300, 301, 400, 200]
    assert registry.match("9", set()) == []


def test_config_handed_out_once_and_only_to_an_activities_poll():
    registry = registry_with_job()
    [entry] = registry.match("", {301})
    config = PendingConfig("X=1\n")
    registry.offer(entry, config)
    with pytest.raises(BusyError, match="already waiting"):
        registry.offer(entry, PendingConfig("X=2\n"))
    assert registry.poll(7, (301, 200, 100), 301, 1000, False) is None  # tracing: no activities bit
    assert registry.poll(7, (301, 200, 100), 301, 1000, True) is config
    assert config.delivered_at is not None
    assert registry.poll(7, (301, 200, 100), 301, 1000, True) is None
    registry.undeliver(7, (301, 200, 100), 301, config)  # the reply could not be sent
    assert config.delivered_at is None
    assert registry.poll(7, (301, 200, 100), 301, 1000, True) is config


def test_withdraw_and_expiry():
    registry = Registry(keepalive_seconds=0.05)
    registry.poll(0, (5,), 5, 0, True)
    [entry] = registry.entries()
    config = PendingConfig("X=1\n")
    registry.offer(entry, config)
    assert registry.withdraw(entry, config) and not registry.withdraw(entry, config)
    time.sleep(0.1)
    assert [e.host_pid for e in registry.expire()] == [5]
    assert registry.entries() == [] and not registry.is_registered(entry)
    with pytest.raises(BusyError, match="stopped polling"):
        registry.offer(entry, config)


def test_kineto_file_name_follows_libkineto():
    assert kineto_config.kineto_file_name("/t/rank0.pt.trace.json", 42) == "/t/rank0_42.pt.trace.json"
    assert kineto_config.kineto_file_name("/t/a.json", 42) == "/t/a_42.json"
    assert kineto_config.kineto_file_name("/t/trace.log", 42) == "/t/trace.log"


def test_config_text_duration_cpu_and_iterations_gpu():
    duration = kineto_config.config_text(
        kineto_config.TraceSpec("/t/x.pt.trace.json", 1_800_000_000_000, duration_ms=500, record_shapes=True),
        cuda=False, trace_id="h:1")
    lines = duration.splitlines()
    assert lines[:2] == ["ACTIVITIES_LOG_FILE=/t/x.pt.trace.json",
                         "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event"]
    assert {"PROFILE_START_TIME=1800000000000", "ACTIVITIES_DURATION_MSECS=500", "PROFILE_REPORT_INPUT_SHAPES=true",
            "PROFILE_WITH_STACK=false", "REQUEST_TRACE_ID=h:1"} <= set(lines)
    assert all(line.count("=") == 1 for line in lines)  # libkineto abandons the config on any other line
    iterations = kineto_config.config_text(
        kineto_config.TraceSpec("/t/x.json", 0, iterations=3, with_stack=True), cuda=True, trace_id="h:2")
    assert "ACTIVITIES_ITERATIONS=3" in iterations and "PROFILE_START_TIME" not in iterations
    types = next(line for line in iterations.splitlines() if line.startswith("ACTIVITY_TYPES=")).split("=")[1]
    assert {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "python_function"} <= set(types.split(","))


def test_one_entry_per_sending_process_whatever_pids_it_claims():
    registry = Registry()
    for fake in range(1000):
        registry.poll(0, (fake, 1), 77, 0, True)
    [entry] = registry.entries()
    assert entry.pids == (999, 1)  # the latest claim replaced the earlier ones


def test_registry_is_bounded_per_user_and_in_all():
    registry = Registry(keepalive_seconds=0.05)
    for pid in range(1, MAX_ENTRIES_PER_UID + 1):
        registry.poll(0, (pid,), pid, 5, True)
    with pytest.raises(RegistryFullError, match="1024 of uid 5"):
        registry.poll(0, (99999,), 99999, 5, True)
    registry.poll(0, (1, 2), 1, 5, True)  # a known process may still change its ancestry
    registry.poll(0, (99999,), 99999, 6, True)  # another user still registers
    time.sleep(0.1)
    assert len(registry.expire()) == MAX_ENTRIES_PER_UID + 1
    registry.poll(0, (99999,), 99999, 5, True)  # room again once they stopped polling


def test_a_process_changing_its_job_at_every_poll_logs_once(caplog):
    caplog.set_level(logging.INFO, logger="agentd.kineto.registry")
    registry = Registry()
    for job in range(1000):
        registry.poll(job, (77,), 77, 0, True)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "Kineto client registered", "re-registered: Kineto client registered again"]
    [entry] = registry.entries()
    assert entry.job_id == "999"
