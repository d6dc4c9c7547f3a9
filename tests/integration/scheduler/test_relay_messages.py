"""The outbox relay publishes each domain event as the protocol's message, from the real store into JetStream.

Every event kind and every assignment goes through the store, the relay and a real JetStream, is read back
and validated with the protocol's models, and is checked for its subject and `Nats-Msg-Id`; and a row
written by the schema before 0004 (subject, msg id, raw body) is converted by the migration and then
published as the same message.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from sqlalchemy import text

from devsched.core.events import DeviceEventCause, DeviceEventKind
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.core.status import EventKind as E
from devsched.protocol.codec import decode
from devsched.protocol.messages import Assignment, DeviceEventMessage, Plan, Step, TaskEvent
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, assignment_msg_id, event_msg_id
from devsched.scheduler.jetstream import ensure_streams
from devsched.scheduler.relay import Relay
from devsched.store import ManualClock, Store
from devsched.store.migrations import downgrade, upgrade
from devsched.store.outbox import trace_headers
from support.databases import in_thread, owner_url, service_url
from support.scheduler_harness import delete_streams, scheduler_settings
from support.store_lab import PLAN, Lab

pytestmark = pytest.mark.integration

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: The fields PROTOCOL.md lists for each message (a task event may carry more: `progress`).
EVENT_FIELDS = {"event", "task_id", "seq", "attempt", "status", "at", "host_id", "device_id", "reason"}
ASSIGNMENT_FIELDS = {"task_id", "attempt", "lease_id", "device_id", "plan", "ttl_s", "expires_at"}


@pytest.fixture
async def relay(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, clock: ManualClock
) -> AsyncIterator[Relay]:
    """A relay over the scheduler's own database role, with the streams created; they are deleted after."""
    settings = scheduler_settings(database_url, nats_url, subject_prefix)
    store = Store.connect(settings.database_url, clock=clock)
    js = nc.jetstream()
    subjects = Subjects(subject_prefix)
    await ensure_streams(js, subjects, settings)
    try:
        yield Relay(store, js, subjects, settings)
    finally:
        await store.close()
        await delete_streams(nc, subject_prefix)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def relay_everything(relay: Relay, store: Store) -> None:
    while await relay.step():
        pass
    assert await store.unsent_count() == 0


@dataclass(frozen=True)
class Stored:
    """One message as a stream stores it."""

    subject: str
    headers: dict[str, str]
    data: bytes


async def stored(nc: NatsClient, stream: str) -> list[Stored]:
    """Every message of `stream` in order, read by sequence (a work-queue stream has no second consumer)."""
    js = nc.jetstream()
    state = (await js.stream_info(stream)).state
    out = []
    for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
        raw = await js.get_msg(stream, seq)
        assert raw.subject is not None
        assert raw.data is not None
        out.append(Stored(raw.subject, dict(raw.headers or {}), raw.data))
    return out


async def published(nc: NatsClient, subjects: Subjects) -> tuple[list[Stored], list[Stored]]:
    """(events, assignments) as the streams hold them."""
    return await stored(nc, subjects.events_stream), await stored(nc, subjects.assignments_stream)


async def test_every_event_kind_and_every_assignment_is_the_protocols_message(
    relay: Relay, database_url: str, nc: NatsClient, subject_prefix: str, clock: ManualClock
) -> None:
    store = Store.connect(service_url(database_url, "scheduler"), clock=clock)
    lab = Lab(store, clock)
    subjects = Subjects(subject_prefix)
    try:
        await lab.host("h1", "h1-d1", "h1-d2")
        token = trace_headers.set({"traceparent": TRACEPARENT})
        try:  # one task in a request's trace: its requests' events and its assignment carry it
            done = await lab.running()  # submitted, assigned, dispatched
            await store.renew(done, {"step": "flash", "index": 0, "of": 1})  # progress
            await store.report(done, Outcome.DONE, result={"steps": []})  # done
        finally:
            trace_headers.reset(token)
        cancelled = await lab.running()
        await store.request_cancel(cancelled.task_id, reason="enough")  # cancel_requested
        await store.report(cancelled, Outcome.CANCELLED)  # cancelled
        retried = await lab.running(max_attempts=2)
        await lab.expire(retried)  # requeued (the sweep)
        clock.advance(31)  # past the device's grace
        await lab.alive()
        second = await lab.assign_one(retried.task_id)  # assigned again: attempt 2
        await store.claim(second)
        await store.report(second, Outcome.FAILED, reason="exit 7")  # failed
        never = await lab.submit(labels={"platform": "none"})
        await store.request_cancel(never)  # cancelled while queued
        await relay_everything(relay, store)
    finally:
        await store.close()

    events, assignments = await published(nc, subjects)
    by_task: dict[uuid.UUID, list[TaskEvent]] = {}
    for msg in events:
        assert json.loads(msg.data).keys() >= EVENT_FIELDS
        event = decode(TaskEvent, msg.data)
        assert msg.subject == subjects.task_events(event.task_id)
        assert msg.headers[MSG_ID_HEADER] == event_msg_id(event.task_id, event.seq)
        by_task.setdefault(event.task_id, []).append(event)
    assert {e.event for task in by_task.values() for e in task} == set(EventKind), "every kind was published"
    for task in by_task.values():
        assert [e.seq for e in task] == list(range(1, len(task) + 1)), "one relay publishes in commit order"

    kinds = {t: [e.event for e in task] for t, task in by_task.items()}
    assert kinds == {
        done.task_id: [E.SUBMITTED, E.ASSIGNED, E.DISPATCHED, E.PROGRESS, E.DONE],
        cancelled.task_id: [E.SUBMITTED, E.ASSIGNED, E.DISPATCHED, E.CANCEL_REQUESTED, E.CANCELLED],
        retried.task_id: [E.SUBMITTED, E.ASSIGNED, E.DISPATCHED, E.REQUEUED, E.ASSIGNED, E.DISPATCHED, E.FAILED],
        never: [E.SUBMITTED, E.CANCELLED],
    }
    progress = by_task[done.task_id][3]
    assert progress.progress is not None
    assert (progress.progress.step, progress.progress.index, progress.progress.of) == ("flash", 0, 1)
    assert (progress.attempt, progress.host_id, progress.status) == (1, "h1", TaskStatus.DISPATCHED)
    assert all(e.progress is None for task in by_task.values() for e in task if e.event is not E.PROGRESS)
    assert by_task[cancelled.task_id][3].reason == "enough"
    requeued, failed = by_task[retried.task_id][3], by_task[retried.task_id][6]
    assert (requeued.status, requeued.attempt, requeued.reason) == (TaskStatus.QUEUED, 1, "lease_expired")
    assert (failed.status, failed.attempt, failed.reason) == (TaskStatus.FAILED, 2, "exit 7")
    assert (by_task[never][1].status, by_task[never][1].reason) == (TaskStatus.CANCELLED, "cancelled_while_queued")
    assert (by_task[never][1].attempt, by_task[never][1].host_id) == (None, None)

    leases = {(lease.task_id, lease.attempt): lease for lease in (done, cancelled, retried, second)}
    assert len(assignments) == len(leases)
    for msg in assignments:
        assert json.loads(msg.data).keys() == ASSIGNMENT_FIELDS
        a = decode(Assignment, msg.data)
        lease = leases.pop((a.task_id, a.attempt))
        assert msg.subject == subjects.assign(lease.host_id)
        assert msg.headers[MSG_ID_HEADER] == assignment_msg_id(a.task_id, a.attempt)
        assert a.lease_id == lease.lease_id
        assert a.plan == Plan.model_validate(PLAN)
        assert a.ttl_s == 30
    assert not leases

    traced = [m for m in events + assignments if m.headers.get("traceparent") == TRACEPARENT]
    assert len(traced) == len(by_task[done.task_id]) + 1, "the traced task's events and its assignment"


INFRA = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}]}
DEVICE_EVENT_FIELDS = {"event", "device_id", "host_id", "at", "by", "infra_failures", "reason"}


async def test_device_events_are_published_on_the_devices_subject(
    relay: Relay, database_url: str, nc: NatsClient, subject_prefix: str, clock: ManualClock
) -> None:
    store = Store.connect(service_url(database_url, "scheduler"), clock=clock)
    lab = Lab(store, clock)
    subjects = Subjects(subject_prefix)
    try:
        await lab.host("h1", "h1-d1")
        for _ in range(3):  # the third quarantines the device
            lease = await lab.running(plan=INFRA, device_id="h1-d1")
            result = {"steps": [{"name": "flash", "status": "failed", "exit_code": 1}]}
            await store.report(lease, Outcome.FAILED, reason="flash failed", result=result)
        await store.drain_device("h1-d1", False)  # `devsched drain h1-d1 --undo`
        await relay_everything(relay, store)
    finally:
        await store.close()

    events, _ = await published(nc, subjects)
    device = [m for m in events if m.subject.startswith(f"{subject_prefix}.events.device.")]
    assert [m.subject for m in device] == [subjects.device_events("h1-d1")] * 2
    got = [decode(DeviceEventMessage, m.data) for m in device]
    assert all(json.loads(m.data).keys() == DEVICE_EVENT_FIELDS for m in device)
    assert [(e.event, e.by, e.infra_failures) for e in got] == [
        (DeviceEventKind.QUARANTINED, DeviceEventCause.INFRA_FAILURES, 3),
        (DeviceEventKind.RETURNED, DeviceEventCause.OPERATOR, 0),
    ]
    assert {e.host_id for e in got} == {"h1"}
    ids = [m.headers[MSG_ID_HEADER] for m in device]
    assert len(set(ids)) == 2
    assert all(i.startswith("device.h1-d1.") for i in ids)


# -- rows from before 0004 ---------------------------------------------------------------------------------

_OLD_ROW = text(
    "INSERT INTO outbox (subject, msg_id, payload, headers, created_at, sent_at)"
    " VALUES (:subject, :msg_id, CAST(:payload AS jsonb), CAST(:headers AS jsonb), now(), :sent_at)"
)
_OLD_ROWS = text("SELECT subject, msg_id, payload, headers, sent_at IS NULL AS unsent FROM outbox ORDER BY id")


def old_rows(prefix: str) -> list[dict[str, Any]]:
    """Rows as the outbox of 0003 wrote them: a task's events (the first already sent) and its assignment."""
    task, lease = uuid.uuid4(), uuid.uuid4()
    plan = Plan(steps=[Step(name="flash", action="shell", args={"command": "echo hi"})]).model_dump(mode="json")
    queued = {
        "task_id": str(task),
        "attempt": None,
        "status": "queued",
        "at": "2026-12-01T10:00:00.000001Z",
        "host_id": None,
        "device_id": None,
        "reason": None,
    }
    running = {**queued, "attempt": 1, "status": "dispatched", "host_id": "h1", "device_id": "h1-d1"}
    step = {"step": "flash", "index": 0, "of": 1}
    events = [
        ({**queued, "event": "submitted", "seq": 1}, False),
        ({**running, "event": "progress", "seq": 4, "progress": step}, True),
        ({**running, "event": "done", "seq": 5, "status": "done", "reason": "all good"}, True),
    ]
    rows = [
        {
            "subject": f"{prefix}.events.task.{task}",
            "msg_id": f"{task}:{body['seq']}",
            "payload": body,
            "headers": {"traceparent": TRACEPARENT},
            "unsent": unsent,
        }
        for body, unsent in events
    ]
    assignment = {
        "task_id": str(task),
        "attempt": 1,
        "lease_id": str(lease),
        "device_id": "h1-d1",
        "plan": plan,
        "ttl_s": 30,
        "expires_at": "2026-12-01T10:00:30.000001Z",
    }
    rows.append(
        {"subject": f"{prefix}.assign.h1", "msg_id": f"{task}.1", "payload": assignment, "headers": {}, "unsent": True}
    )
    return rows


async def test_rows_unsent_at_the_upgrade_are_published_as_the_same_messages(
    relay: Relay, database_url: str, nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVSCHED_SUBJECT_PREFIX", subject_prefix)  # what the downgrade writes subjects with
    owner = owner_url(database_url)
    in_thread(lambda: downgrade(owner, "0003"))
    rows = old_rows(subject_prefix)
    admin = Store.connect(database_url)
    try:
        async with admin.engine.begin() as conn:
            for r in rows:
                params = {
                    "subject": r["subject"],
                    "msg_id": r["msg_id"],
                    "payload": json.dumps(r["payload"]),
                    "headers": json.dumps(r["headers"]),
                    "sent_at": None if r["unsent"] else datetime.now(UTC),
                }
                await conn.execute(_OLD_ROW, params)
        in_thread(lambda: upgrade(owner))
        assert await admin.unsent_count() == 3, "the rows waiting at the upgrade still wait"

        # and back: the downgrade writes the same wire columns again
        in_thread(lambda: downgrade(owner, "0003"))
        async with admin.engine.connect() as conn:
            back = [dict(r._mapping) for r in (await conn.execute(_OLD_ROWS)).all()]
        assert back == [{k: r[k] for k in ("subject", "msg_id", "payload", "headers", "unsent")} for r in rows]
        in_thread(lambda: upgrade(owner))
        await relay_everything(relay, admin)
    finally:
        await admin.close()

    subjects = Subjects(subject_prefix)
    events, assignments = await published(nc, subjects)
    waiting = [r for r in rows if r["unsent"]]
    streams = [subjects.events_stream] * 2 + [subjects.assignments_stream]
    assert [(m.subject, m.headers) for m in events + assignments] == [
        (r["subject"], {**r["headers"], MSG_ID_HEADER: r["msg_id"], "Nats-Expected-Stream": stream})
        for r, stream in zip(waiting, streams, strict=True)
    ]
    # the same bodies; a task event now also says `"progress": null` where none applies
    assert [json.loads(m.data) for m in events] == [{"progress": None, **r["payload"]} for r in waiting[:2]]
    assert [json.loads(m.data) for m in assignments] == [waiting[2]["payload"]]
