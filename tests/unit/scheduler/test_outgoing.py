"""What the relay publishes for each domain event: subject, stream, message id and the protocol's body."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from devsched.core.events import (
    AttemptAssigned,
    DeviceEvent,
    DeviceEventCause,
    DeviceEventKind,
    StepProgress,
    TaskEvent,
)
from devsched.core.status import EventKind, TaskStatus
from devsched.protocol.codec import decode, encode
from devsched.protocol.messages import Assignment, DeviceEventMessage
from devsched.protocol.messages import TaskEvent as WireTaskEvent
from devsched.protocol.subjects import Subjects
from devsched.scheduler.outgoing import outgoing, resent

pytestmark = pytest.mark.unit

S = Subjects("lab-1")
TASK = uuid.UUID("6003a64b-1520-4775-94e1-a53e195a7110")
AT = datetime(2026, 12, 1, 10, 0, 0, 1, tzinfo=UTC)
PLAN = {"steps": [{"name": "flash", "action": "noop"}]}


def assigned(**changes: object) -> AttemptAssigned:
    values: dict[str, object] = {
        "task_id": TASK,
        "attempt": 2,
        "lease_id": uuid.uuid4(),
        "host_id": "h1",
        "device_id": "h1-d1",
        "plan": PLAN,
        "ttl_s": 30,
        "expires_at": AT,
    }
    return AttemptAssigned(**{**values, **changes})  # type: ignore[arg-type]


def test_a_task_event_goes_to_its_tasks_subject_with_task_colon_seq() -> None:
    event = TaskEvent(
        event=EventKind.PROGRESS,
        task_id=TASK,
        seq=4,
        status=TaskStatus.DISPATCHED,
        at=AT,
        attempt=1,
        host_id="h1",
        device_id="h1-d1",
        progress=StepProgress(step="flash", index=0, of=1),
    )
    out = outgoing(event, S)
    assert (out.subject, out.stream, out.msg_id) == (f"lab-1.events.task.{TASK}", "LAB_1_EVENTS", f"{TASK}:4")
    assert json.loads(out.data) == {
        "event": "progress",
        "task_id": str(TASK),
        "seq": 4,
        "attempt": 1,
        "status": "dispatched",
        "at": "2026-12-01T10:00:00.000001Z",
        "host_id": "h1",
        "device_id": "h1-d1",
        "reason": None,
        "progress": {"step": "flash", "index": 0, "of": 1},
    }
    assert decode(WireTaskEvent, out.data) == WireTaskEvent.from_value(event)


def test_an_assignment_goes_to_its_hosts_subject_with_task_dot_attempt() -> None:
    a = assigned()
    out = outgoing(a, S)
    assert (out.subject, out.stream, out.msg_id) == ("lab-1.assign.h1", "LAB_1_ASSIGNMENTS", f"{TASK}.2")
    body = decode(Assignment, out.data)
    assert (body.task_id, body.attempt, body.lease_id, body.device_id) == (TASK, 2, a.lease_id, "h1-d1")
    assert body.plan.steps[0].timeout_s == 3600.0, "the plan as the protocol defines it, defaults and all"


def test_an_assignment_published_again_is_the_same_message_under_an_id_of_its_own() -> None:
    a = assigned()
    first, again = outgoing(a, S), resent(a, S, 1767225600123)
    assert (again.subject, again.stream, again.data) == (first.subject, first.stream, first.data)
    assert again.msg_id == f"{TASK}.2.resync.1767225600123"
    assert resent(a, S, 1767225600124).msg_id != again.msg_id


@pytest.mark.parametrize(
    "bad",
    [
        {"plan": {"steps": []}},  # the protocol wants at least one step
        {"device_id": "not a token"},
        {"expires_at": datetime(2026, 12, 1)},  # naive: no offset to write
    ],
)
def test_what_is_not_a_valid_protocol_message_is_never_published(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        outgoing(assigned(**bad), S)


def test_a_host_id_that_would_widen_the_subject_is_refused() -> None:
    with pytest.raises(ValueError, match="host id"):
        outgoing(assigned(host_id="h1.>"), S)


def test_a_device_event_goes_to_its_devices_subject_named_by_its_outbox_id() -> None:
    event = DeviceEvent(
        event=DeviceEventKind.QUARANTINED,
        device_id="h1-d1",
        host_id="h1",
        at=AT,
        by=DeviceEventCause.INFRA_FAILURES,
        infra_failures=3,
        reason="3 consecutive infrastructure failures (last: infra)",
    )
    out = outgoing(event, S, ref=42)
    assert (out.subject, out.stream, out.msg_id) == ("lab-1.events.device.h1-d1", "LAB_1_EVENTS", "device.h1-d1.42")
    assert json.loads(out.data) == {
        "event": "device_quarantined",
        "device_id": "h1-d1",
        "host_id": "h1",
        "at": "2026-12-01T10:00:00.000001Z",
        "by": "infra_failures",
        "infra_failures": 3,
        "reason": "3 consecutive infrastructure failures (last: infra)",
    }
    assert decode(DeviceEventMessage, out.data).event is DeviceEventKind.QUARANTINED
    with pytest.raises(ValueError, match="outbox id"):
        outgoing(event, S)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "event": EventKind.SUBMITTED,
            "status": TaskStatus.QUEUED,
            "attempt": None,
            "host_id": None,
            "device_id": None,
        },
        {"event": EventKind.DONE, "status": TaskStatus.DONE, "reason": "done"},
        {"event": EventKind.FAILED, "status": TaskStatus.FAILED, "reason": 'ü "q" \\ \n\t\x00\x1f\x7f \u2028 😀'},
        {"event": EventKind.PROGRESS, "progress": StepProgress(step="flâsh\n", index=2, of=3)},
        {"at": datetime(2026, 12, 1, 11, 0, 0, tzinfo=timezone(timedelta(hours=1)))},
        {"at": datetime(2026, 12, 1, 10, 0, 0, 0, tzinfo=UTC), "seq": 2**40, "attempt": 7},
    ],
)
def test_a_task_event_is_written_byte_for_byte_as_the_protocols_model_writes_it(changes: dict[str, object]) -> None:
    values: dict[str, object] = {
        "event": EventKind.DISPATCHED,
        "task_id": TASK,
        "seq": 3,
        "status": TaskStatus.DISPATCHED,
        "at": AT,
        "attempt": 1,
        "host_id": "h1",
        "device_id": "h1-d1",
    }
    event = TaskEvent(**{**values, **changes})  # type: ignore[arg-type]
    assert outgoing(event, S).data == encode(WireTaskEvent.from_value(event))


@pytest.mark.parametrize(
    "changes",
    [
        {"device_id": "h1 d1"},
        {"host_id": "h1\n"},
        {"attempt": 0},
        {"reason": "lone \ud800 surrogate"},
        {"at": datetime(2026, 12, 1, 10, 0, 0)},  # naive
    ],
)
def test_a_task_event_the_protocol_refuses_is_refused_as_the_model_refuses_it(changes: dict[str, object]) -> None:
    values: dict[str, object] = {
        "event": EventKind.DISPATCHED, "task_id": TASK, "seq": 3, "status": TaskStatus.DISPATCHED, "at": AT,
        "attempt": 1, "host_id": "h1", "device_id": "h1-d1",
    }  # fmt: skip
    with pytest.raises((ValidationError, ValueError)):
        outgoing(TaskEvent(**{**values, **changes}), S)  # type: ignore[arg-type]
