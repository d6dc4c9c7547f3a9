"""Every domain event, pinned: the bytes the relay publishes and the row the outbox stores for the same value.

`event_bytes.json` holds what each case gave when it was written; any change to how an event is laid out,
in the outbox or on the wire, shows here first. The wire is a contract (add, never rename or remove), and
rows stored by one release are read by the next. A field added on purpose changes the file:
`./dev run python tests/unit/scheduler/test_event_bytes.py` writes it again, and its diff is the change.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from devsched.core.events import (
    AttemptAssigned,
    DeviceEvent,
    DeviceEventCause,
    DeviceEventKind,
    DomainEvent,
    StepProgress,
    TaskEvent,
)
from devsched.core.status import EventKind, TaskStatus
from devsched.protocol.subjects import Subjects
from devsched.scheduler.outgoing import outgoing
from devsched.store.outbox import event_row, inserted

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("event_bytes.json")
S = Subjects("lab-1")
TASK = uuid.UUID("6003a64b-1520-4775-94e1-a53e195a7110")
LEASE = uuid.UUID("0b9f5bd6-54a8-4f3e-9d53-7b7b2f0c8a11")
AT = datetime(2026, 12, 1, 10, 0, 0, 1, tzinfo=UTC)
ON = {"attempt": 1, "host_id": "h1", "device_id": "h1-d1"}
PLAN = {
    "steps": [
        {"name": "flash", "action": "shell", "args": {"command": "echo ü"}, "timeout_s": 60},
        {"name": "wait", "action": "sleep", "args": {"seconds": 1.5}},
    ]
}


def task(kind: EventKind, status: TaskStatus, **fields: Any) -> TaskEvent:
    return TaskEvent(event=kind, task_id=TASK, seq=fields.pop("seq", 3), status=status, at=AT, **fields)


CASES: dict[str, DomainEvent] = {
    "submitted": task(EventKind.SUBMITTED, TaskStatus.QUEUED, seq=1),
    "assigned": task(EventKind.ASSIGNED, TaskStatus.ASSIGNED, seq=2, **ON),
    "dispatched": task(EventKind.DISPATCHED, TaskStatus.DISPATCHED, **ON),
    "progress": task(
        EventKind.PROGRESS, TaskStatus.DISPATCHED, seq=4, progress=StepProgress(step="flâsh\n", index=1, of=2), **ON
    ),
    "cancel_requested": task(EventKind.CANCEL_REQUESTED, TaskStatus.DISPATCHED, reason="operator: stop", **ON),
    "requeued": task(EventKind.REQUEUED, TaskStatus.QUEUED, reason="lease_expired", **ON),
    "done": task(EventKind.DONE, TaskStatus.DONE, reason="done", **ON),
    "failed": task(EventKind.FAILED, TaskStatus.FAILED, reason='ü "q" \\ \n\t\x00\x1f\x7f \u2028 😀', **ON),
    "cancelled(queued)": task(EventKind.CANCELLED, TaskStatus.CANCELLED, reason="why not"),
    "failed(other offset, big seq)": TaskEvent(
        event=EventKind.FAILED,
        task_id=TASK,
        seq=2**40,
        status=TaskStatus.FAILED,
        at=datetime(2026, 12, 1, 11, 0, 0, tzinfo=timezone(timedelta(hours=1))),
        attempt=7,
        reason="queue_timeout",
    ),
    "assignment": AttemptAssigned(
        task_id=TASK, attempt=2, lease_id=LEASE, host_id="h1", device_id="h1-d1", plan=PLAN, ttl_s=30, expires_at=AT
    ),
    "device_quarantined": DeviceEvent(
        event=DeviceEventKind.QUARANTINED,
        device_id="h1-d1",
        host_id="h1",
        at=AT,
        by=DeviceEventCause.INFRA_FAILURES,
        infra_failures=3,
        reason="3 consecutive infrastructure failures (last: infra)",
    ),
    "device_returned": DeviceEvent(
        event=DeviceEventKind.RETURNED,
        device_id="h1-d1",
        host_id="h1",
        at=AT,
        by=DeviceEventCause.OPERATOR,
        infra_failures=0,
    ),
    "device_returned(health check)": DeviceEvent(
        event=DeviceEventKind.RETURNED,
        device_id="h1-d1",
        host_id="h1",
        at=AT,
        by=DeviceEventCause.HEALTH_CHECK,
        infra_failures=0,
        reason="adb offline",
    ),
}


def written(event: DomainEvent) -> dict[str, Any]:
    """What the relay publishes for `event` (outbox id 42) and what the outbox stores for it."""
    out = outgoing(event, S, ref=42)
    kind, data, headers = event_row(event, {"traceparent": "00-1-2-01"})
    return {
        "subject": out.subject,
        "stream": out.stream,
        "msg_id": out.msg_id,
        "body": out.data.decode(),
        "row": {"kind": kind, "data": json.loads(data), "headers": json.loads(headers)},
    }


def test_every_case_is_pinned() -> None:
    assert set(json.loads(GOLDEN.read_text())) == set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_an_event_is_published_and_stored_as_pinned(name: str) -> None:
    assert written(CASES[name]) == json.loads(GOLDEN.read_text())[name]


@pytest.mark.parametrize("name", list(CASES))
def test_a_stored_row_reads_back_as_the_event_and_publishes_the_same_bytes(name: str) -> None:
    row = json.loads(GOLDEN.read_text())[name]["row"]
    (message,) = inserted(json.dumps([{"id": 42, **row}]))
    assert message.event == CASES[name]
    assert outgoing(message.event, S, ref=42).data.decode() == written(CASES[name])["body"]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({name: written(event) for name, event in CASES.items()}, indent=1) + "\n")
