"""`Store.gauges` and `Store.starts` (the metrics' reads) against a real database, and the operation hook."""

from __future__ import annotations

import pytest

from devsched.core.status import DeviceState, Outcome, TaskStatus
from devsched.store import ManualClock, Store
from devsched.store.stats import PRIORITY_BANDS, Grouping
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def test_an_empty_database_has_every_key_at_zero(store: Store) -> None:
    g = await store.gauges()
    assert g.queued == dict.fromkeys(PRIORITY_BANDS, 0)
    assert g.oldest_queued_s == dict.fromkeys(PRIORITY_BANDS, 0.0)
    assert g.tasks == {s.value: 0 for s in TaskStatus}
    assert g.devices == {s.value: 0 for s in DeviceState}
    assert (g.hosts_online, g.hosts_offline, g.outbox_unsent, g.outbox_oldest_unsent_s) == (0, 0, 0, 0.0)


async def test_gauges_count_the_queue_tasks_hosts_devices_and_the_outbox(lab: Lab, clock: ManualClock) -> None:
    store = lab.store
    await lab.host("h1", "d1", "d2")
    await lab.host("idle")  # lists a device, stays online
    running = await lab.running(labels={"platform": "android"}, device_id="d1", lease_ttl_s=600)
    await store.drain_device("d2", True)
    nowhere = {"labels": {"platform": "nowhere"}}
    await lab.submit(priority=7, **nowhere)
    clock.advance(4)
    await lab.submit(priority=-3, **nowhere)
    await lab.submit(**nowhere)
    clock.advance(6)
    await store.heartbeat("idle")

    g = await store.gauges()
    assert g.queued == {"low": 1, "normal": 1, "high": 1}
    assert g.oldest_queued_s == {"low": pytest.approx(6), "normal": pytest.approx(6), "high": pytest.approx(10)}
    assert g.tasks[TaskStatus.QUEUED.value] == 3
    assert g.tasks[TaskStatus.DISPATCHED.value] == 1
    assert (g.hosts_online, g.hosts_offline) == (2, 0)
    assert g.devices == {"available": 1, "reserved": 1, "offline": 0, "drained": 1, "quarantined": 0}
    assert g.outbox_unsent > 0  # no relay here: every event waits
    assert g.outbox_oldest_unsent_s == pytest.approx(10)

    clock.advance(20)  # past 3 heartbeats of 5 s: h1 is offline (idle heartbeats)
    await store.heartbeat("idle")
    g = await store.gauges()
    assert (g.hosts_online, g.hosts_offline) == (1, 1)
    # a busy device stays reserved, a drained one drained, whatever its host
    assert g.devices == {"available": 1, "reserved": 1, "offline": 0, "drained": 1, "quarantined": 0}
    await store.report(running, Outcome.DONE)  # a sign of life of h1: online again, d1 free
    g = await store.gauges()
    assert g.devices == {"available": 2, "reserved": 0, "offline": 0, "drained": 1, "quarantined": 0}
    assert g.tasks[TaskStatus.DONE.value] == 1
    clock.advance(20)
    await store.heartbeat("idle")
    g = await store.gauges()
    assert g.devices == {"available": 1, "reserved": 0, "offline": 1, "drained": 1, "quarantined": 0}


async def test_by_group_the_queue_and_devices_count_by_one_labels_value_past_the_limit_as_other(
    lab: Lab, clock: ManualClock
) -> None:
    store = lab.store
    await lab.host("h1", "a1", "a2", "a3", platform="android")
    await lab.host("h2", "i1", "i2", platform="ios")
    await lab.host("h3", "l1", platform="linux")
    await lab.host("h4", "r1", model="rig")  # no platform label
    await store.drain_device("i2", True)
    await lab.submit(priority=5, labels={"platform": "android", "need": "x"})  # nothing matches: all stay queued
    clock.advance(2)
    await lab.submit(labels={"platform": "windows"})  # a value no device has
    await lab.submit(labels={"platform": "linux", "need": "x"})
    await lab.submit(labels={"model": "rig", "need": "x"})  # no platform asked for

    g = await store.gauges(Grouping("platform", limit=2))
    assert g.grouped is not None
    # android (3 devices) and ios (2) are kept; linux (1 device) and windows (tasks only) are `other`
    assert {group for _, group in g.grouped.devices} == {"android", "ios", "other", ""}
    assert {group for _, group in g.grouped.queued} == {"android", "ios", "other", ""}
    assert g.grouped.devices["available", "android"] == 3
    assert (g.grouped.devices["available", "ios"], g.grouped.devices["drained", "ios"]) == (1, 1)
    assert g.grouped.devices["available", "other"] == 1
    assert g.grouped.devices["available", ""] == 1
    assert g.grouped.queued["high", "android"] == 1
    assert g.grouped.queued["normal", "android"] == 0
    assert g.grouped.queued["normal", "other"] == 2
    assert g.grouped.queued["normal", ""] == 1
    assert g.grouped.oldest_queued_s["high", "android"] == pytest.approx(2)
    assert g.grouped.oldest_queued_s["normal", "ios"] == 0.0
    # the groups add up to the totals, which are those of a reading without groups
    plain = await store.gauges()
    assert plain.grouped is None
    assert (g.queued, g.oldest_queued_s, g.devices) == (plain.queued, plain.oldest_queued_s, plain.devices)
    for state, n in g.devices.items():
        assert sum(v for (s, _), v in g.grouped.devices.items() if s == state) == n
    for band, n in g.queued.items():
        assert sum(v for (b, _), v in g.grouped.queued.items() if b == band) == n

    wide = await store.gauges(Grouping("platform", limit=10))
    assert wide.grouped is not None
    assert {group for _, group in wide.grouped.devices} == {"android", "ios", "linux", "windows", ""}


async def test_by_group_many_distinct_values_stay_within_the_limit(lab: Lab) -> None:
    """Hostile selectors (a new value per task) cannot multiply the series: the groups stay `limit` + 2."""
    await lab.host("h1", "a1", "a2", platform="android")
    await lab.host("h2", "i1", platform="ios")
    for i in range(300):
        await lab.submit(labels={"platform": f"junk-{i:03}", "need": "x"}, priority=i % 3 - 1)
    for _ in range(5):  # more queued tasks than any device value: devices still rank first
        await lab.submit(labels={"platform": "junk-999", "need": "x"})

    g = await lab.store.gauges(Grouping("platform", limit=3))
    assert g.grouped is not None
    groups = {group for _, group in g.grouped.queued} | {group for _, group in g.grouped.devices}
    assert groups == {"android", "ios", "junk-999", "other", ""}
    assert len(g.grouped.queued) == len(PRIORITY_BANDS) * 5
    assert len(g.grouped.devices) == len(DeviceState) * 5
    assert sum(n for (_, group), n in g.grouped.queued.items() if group == "other") == 300
    assert g.grouped.queued["normal", "junk-999"] == 5
    assert sum(g.queued.values()) == 305


async def test_a_host_that_lists_no_devices_is_not_counted_offline(lab: Lab, clock: ManualClock) -> None:
    await lab.store.register_host("gone", [])
    clock.advance(60)
    g = await lab.store.gauges()
    assert (g.hosts_online, g.hosts_offline) == (0, 0)


async def test_starts_are_the_submission_and_assignment_times(lab: Lab, clock: ManualClock) -> None:
    await lab.host("h1", "d1")
    task_id = await lab.submit(labels={"platform": "android"})
    submitted = clock.current
    assigned = clock.advance(3)
    lease = await lab.assign_one(task_id)
    starts = await lab.store.starts([task_id], [(task_id, lease.attempt), (task_id, 9)])
    assert starts.created == {task_id: submitted}
    assert starts.assigned == {(task_id, 1): assigned}


async def test_the_operation_hook_hears_each_operation_and_its_time(lab: Lab) -> None:
    heard: list[tuple[str, float]] = []
    lab.store.on_operation = lambda name, seconds: heard.append((name, seconds))
    await lab.host("h1", "d1")
    await lab.submit()
    await lab.store.gauges()
    assert [name for name, _ in heard] == ["register", "submit", "gauges"]
    assert all(0 < seconds < 10 for _, seconds in heard)
    lab.store.on_operation = None
    await lab.store.gauges()
    assert len(heard) == 3
