"""The scheduler's metrics pass (`Stats.refresh`) against a real database: the settings' grouping reaches the scrape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from devsched.scheduler.metrics import DatabaseGauges, Latencies, Stats
from devsched.scheduler.settings import SchedulerSettings
from devsched.store import ManualClock, Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration


@pytest.fixture
async def lab(database_url: str) -> AsyncIterator[Lab]:
    clock = ManualClock()
    store = Store.connect(database_url, clock=clock, heartbeat_interval_s=5.0)
    try:
        yield Lab(store, clock)
    finally:
        await store.close()


async def scrape(lab: Lab, settings: SchedulerSettings) -> list[str]:
    gauges = DatabaseGauges()
    await Stats(lab.store, Latencies(), gauges, grouping=settings.metrics_grouping).refresh()
    registry = CollectorRegistry()
    registry.register(gauges)
    return generate_latest(registry).decode().splitlines()


async def test_a_pass_with_metrics_group_by_exports_the_queue_and_devices_by_group(lab: Lab) -> None:
    await lab.host("h1", "a1", "a2", platform="android")
    await lab.host("h2", "i1", platform="ios")
    await lab.submit(labels={"platform": "ios", "need": "x"})
    for i in range(20):
        await lab.submit(labels={"platform": f"made-up-{i}", "need": "x"})

    lines = await scrape(lab, SchedulerSettings(metrics_group_by="platform", metrics_group_limit=2))
    assert 'devsched_devices{group="android",state="available"} 2.0' in lines
    assert 'devsched_queued_tasks{group="ios",priority="normal"} 1.0' in lines
    assert 'devsched_queued_tasks{group="other",priority="normal"} 20.0' in lines
    groups = {line.split('group="')[1].split('"')[0] for line in lines if line.startswith("devsched_queued_tasks{")}
    assert groups == {"android", "ios", "other", ""}

    plain = await scrape(lab, SchedulerSettings())
    assert 'devsched_queued_tasks{priority="normal"} 21.0' in plain
    assert not [line for line in plain if "group=" in line]
