"""The scheduler's metrics that need no server: latencies from committed events, reply codes, the gauges' families."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from devsched.core.errors import LeaseExpired, NotFound, TaskTerminal, TooManyRequests
from devsched.core.events import TaskEvent
from devsched.core.status import EventKind, TaskStatus
from devsched.protocol.transport import EndpointTally
from devsched.scheduler.api import observed
from devsched.scheduler.metrics import REGISTRY, DatabaseGauges, Latencies, reply_counter
from devsched.scheduler.settings import SchedulerSettings
from devsched.store import Committed, OutboxMessage
from devsched.store.stats import Gauges, Grouped, Grouping

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def event(kind: EventKind, task_id: uuid.UUID, at: datetime, attempt: int | None = None) -> OutboxMessage:
    status = {EventKind.SUBMITTED: TaskStatus.QUEUED, EventKind.ASSIGNED: TaskStatus.ASSIGNED,
              EventKind.DISPATCHED: TaskStatus.DISPATCHED, EventKind.DONE: TaskStatus.DONE}[kind]  # fmt: skip
    return OutboxMessage(1, TaskEvent(kind, task_id, 1, status, at, attempt=attempt), {})


def committed(*messages: OutboxMessage) -> Committed:
    return Committed("op", messages, False)


def test_latencies_whose_start_this_process_saw_are_observed_at_once() -> None:
    latencies = Latencies()
    task = uuid.uuid4()
    assigned, claimed = (
        value("devsched_submit_to_assigned_seconds_sum"),
        value("devsched_assigned_to_claimed_seconds_sum"),
    )
    latencies.on_commit(committed(event(EventKind.SUBMITTED, task, T0)))
    latencies.on_commit(committed(event(EventKind.ASSIGNED, task, T0 + timedelta(seconds=2), attempt=1)))
    latencies.on_commit(committed(event(EventKind.DISPATCHED, task, T0 + timedelta(seconds=2.5), attempt=1)))
    assert value("devsched_submit_to_assigned_seconds_sum") - assigned == pytest.approx(2)
    assert value("devsched_assigned_to_claimed_seconds_sum") - claimed == pytest.approx(0.5)
    assert latencies.unresolved == 0
    latencies.on_commit(committed(event(EventKind.DONE, task, T0 + timedelta(seconds=9), attempt=1)))
    assert task not in latencies._created


def test_ends_whose_start_another_replica_saw_wait_for_resolve() -> None:
    latencies = Latencies()
    task = uuid.uuid4()
    before = value("devsched_submit_to_assigned_seconds_count")
    latencies.on_commit(committed(event(EventKind.ASSIGNED, uuid.uuid4(), T0, attempt=1)))
    latencies.on_commit(committed(event(EventKind.DISPATCHED, task, T0, attempt=2)))
    assert latencies.unresolved == 2
    assert value("devsched_submit_to_assigned_seconds_count") == before


def test_remembered_starts_are_bounded() -> None:
    latencies = Latencies(capacity=2)
    tasks = [uuid.uuid4() for _ in range(3)]
    for task in tasks:
        latencies.on_commit(committed(event(EventKind.SUBMITTED, task, T0)))
    assert list(latencies._created) == tasks[1:]


async def test_observed_counts_renewals_reports_and_conflicts_by_code() -> None:
    async def ok(req: object, subject: str) -> str:
        return "reply"

    async def expired(req: object, subject: str) -> str:
        raise LeaseExpired()

    async def terminal(req: object, subject: str) -> str:
        raise TaskTerminal()

    async def missing(req: object, subject: str) -> str:
        raise NotFound("no such task")

    before = {
        "ok": value("devsched_renewals_total", code="ok"),
        "lease_expired": value("devsched_renewals_total", code="lease_expired"),
        "conflict": value("devsched_conflicts_total", code="lease_expired"),
        "report": value("devsched_reports_total", code="task_terminal"),
        "report_conflict": value("devsched_conflicts_total", code="task_terminal"),
        "not_found": value("devsched_conflicts_total", code="not_found"),
    }
    assert await observed("host-renew", ok)(None, "s") == "reply"
    with pytest.raises(LeaseExpired):
        await observed("host-renew", expired)(None, "s")
    with pytest.raises(TaskTerminal):
        await observed("host-report", terminal)(None, "s")
    with pytest.raises(NotFound):
        await observed("tasks-get", missing)(None, "s")
    assert value("devsched_renewals_total", code="ok") - before["ok"] == 1
    assert value("devsched_renewals_total", code="lease_expired") - before["lease_expired"] == 1
    assert value("devsched_conflicts_total", code="lease_expired") - before["conflict"] == 1
    assert value("devsched_reports_total", code="task_terminal") - before["report"] == 1
    assert value("devsched_conflicts_total", code="task_terminal") - before["report_conflict"] == 1
    assert value("devsched_conflicts_total", code="not_found") == before["not_found"]  # 404 is no conflict


def test_every_reply_is_counted_by_endpoint_and_status_a_refusal_outside_the_handler_too() -> None:
    endpoint = "host-heartbeat"
    before = {code: value("devsched_requests_total", endpoint=endpoint, code=code) for code in ("200", "404", "429")}
    tally = EndpointTally(times=True)
    tally.count = reply_counter(endpoint)
    assert REGISTRY.get_sample_value("devsched_requests_total", {"endpoint": endpoint, "code": "200"}) is not None
    tally.record(1000, None)
    tally.record(1000, None)
    tally.record(1000, "404:not_found no such host", NotFound.status)
    tally.error(TooManyRequests("too many requests from this host"))  # the dispatcher's 429, sent before the handler
    after = {code: value("devsched_requests_total", endpoint=endpoint, code=code) for code in before}
    assert {code: after[code] - before[code] for code in before} == {"200": 2, "404": 1, "429": 1}


def test_database_gauges_export_the_last_reading() -> None:
    gauges = DatabaseGauges()
    assert all(not family.samples or family.name == "devsched_outbox_published" for family in gauges.collect())
    gauges.gauges = Gauges(
        at=T0, queued={"low": 0, "normal": 2, "high": 1}, oldest_queued_s={"low": 0.0, "normal": 5.0, "high": 1.0},
        tasks={"queued": 3, "done": 7}, hosts_online=2, hosts_offline=1, devices={"available": 4, "drained": 1},
        outbox_unsent=5, outbox_oldest_unsent_s=1.5,
    )  # fmt: skip
    gauges.published = lambda: 42
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in gauges.collect() for s in f.samples}
    assert samples[("devsched_queued_tasks", (("priority", "normal"),))] == 2
    assert samples[("devsched_queue_oldest_age_seconds", (("priority", "normal"),))] == 5.0
    assert samples[("devsched_tasks", (("status", "done"),))] == 7
    assert samples[("devsched_hosts", (("state", "offline"),))] == 1
    assert samples[("devsched_devices", (("state", "drained"),))] == 1
    assert samples[("devsched_outbox_unsent", ())] == 5
    assert samples[("devsched_outbox_lag_seconds", ())] == 1.5
    assert samples[("devsched_outbox_published_total", ())] == 42
    assert samples[("devsched_gauges_refreshed_timestamp_seconds", ())] == T0.timestamp()


def test_database_gauges_by_group_carry_a_group_label_on_the_queue_and_devices_only() -> None:
    gauges = DatabaseGauges()
    grouped = Grouped(
        queued={("normal", "android"): 2, ("normal", "other"): 1, ("normal", ""): 0},
        oldest_queued_s={("normal", "android"): 5.0, ("normal", "other"): 1.0, ("normal", ""): 0.0},
        devices={("available", "android"): 3, ("available", "other"): 1, ("available", ""): 0},
    )
    gauges.gauges = Gauges(
        at=T0, queued={"normal": 3}, oldest_queued_s={"normal": 5.0}, tasks={"queued": 3}, hosts_online=2,
        hosts_offline=0, devices={"available": 4}, outbox_unsent=0, outbox_oldest_unsent_s=0.0, grouped=grouped,
    )  # fmt: skip
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in gauges.collect() for s in f.samples}
    assert samples[("devsched_queued_tasks", (("group", "android"), ("priority", "normal")))] == 2
    assert samples[("devsched_queued_tasks", (("group", "other"), ("priority", "normal")))] == 1
    assert samples[("devsched_queue_oldest_age_seconds", (("group", "android"), ("priority", "normal")))] == 5.0
    assert samples[("devsched_devices", (("group", "android"), ("state", "available")))] == 3
    assert samples[("devsched_devices", (("group", ""), ("state", "available")))] == 0
    assert ("devsched_queued_tasks", (("priority", "normal"),)) not in samples, "one set of series, not both"
    assert samples[("devsched_tasks", (("status", "queued"),))] == 3
    assert samples[("devsched_hosts", (("state", "online"),))] == 2


def test_the_exposition_by_group_has_one_series_per_group_and_state() -> None:
    gauges = DatabaseGauges()
    groups = ("android", "ios", "other", "")
    grouped = Grouped(
        queued={(band, g): 1 for g in groups for band in ("low", "normal", "high")},
        oldest_queued_s={(band, g): 0.0 for g in groups for band in ("low", "normal", "high")},
        devices={("available", g): 2 for g in groups},
    )
    gauges.gauges = Gauges(
        at=T0, queued={"low": 4, "normal": 4, "high": 4}, oldest_queued_s={"low": 0.0, "normal": 0.0, "high": 0.0},
        tasks={}, hosts_online=1, hosts_offline=0, devices={"available": 8}, outbox_unsent=0,
        outbox_oldest_unsent_s=0.0, grouped=grouped,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(gauges)
    lines = generate_latest(registry).decode().splitlines()
    queued = [line for line in lines if line.startswith("devsched_queued_tasks{")]
    assert len(queued) == 3 * len(groups)
    assert 'devsched_queued_tasks{group="ios",priority="high"} 1.0' in queued
    assert 'devsched_devices{group="other",state="available"} 2.0' in lines
    assert 'devsched_devices{group="",state="available"} 2.0' in lines


def test_grouping_is_off_by_default_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SchedulerSettings().metrics_grouping is None
    monkeypatch.setenv("DEVSCHED_METRICS_GROUP_BY", "platform")
    monkeypatch.setenv("DEVSCHED_METRICS_GROUP_LIMIT", "5")
    assert SchedulerSettings().metrics_grouping == Grouping("platform", 5)
    for name, bad in (("metrics_group_limit", 0), ("metrics_group_limit", 101), ("metrics_group_by", "")):
        with pytest.raises(ValueError, match=name):
            SchedulerSettings(**{name: bad})
