"""What each domain event is on the wire: the protocol's model, its subject, stream and message id.

The one place where a `devsched.core.events` value becomes a JetStream message, for the outbox relay and
for the resync, which publishes an unclaimed attempt's assignment again (`resent`). Building the
model validates the event against the protocol, so nothing malformed reaches a host or a watcher.

Task events, three or four of every task's messages, are written without the model (`_task_event_body`):
building and dumping it cost the relay about 20 us a message (issue 10). The same checks are made by hand
(kinds, numbers in range, tokens, the progress), and an event that fails one goes the model's way, whose
validation error then says what is wrong; tests/unit/scheduler/test_outgoing.py holds the bytes equal.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from devsched.core import events
from devsched.core.ids import TOKEN_PATTERN
from devsched.core.status import EventKind, TaskStatus
from devsched.protocol.base import format_timestamp
from devsched.protocol.codec import encode, from_jsonable
from devsched.protocol.events import DeviceEventMessage
from devsched.protocol.messages import Assignment, Plan, Progress, TaskEvent
from devsched.protocol.plans import MAX_STEPS
from devsched.protocol.subjects import (
    Subjects,
    assignment_msg_id,
    assignment_resend_msg_id,
    device_event_msg_id,
    event_msg_id,
)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish: where, under which `Nats-Msg-Id`, and what (`data`, the body)."""

    subject: str
    stream: str
    msg_id: str
    data: bytes


def task_event(event: events.TaskEvent) -> TaskEvent:
    """The protocol's `TaskEvent` of a domain task event."""
    p = event.progress
    return TaskEvent(
        event=event.kind,
        task_id=event.task_id,
        seq=event.seq,
        attempt=event.attempt,
        status=event.status,
        at=event.at,
        host_id=event.host_id,
        device_id=event.device_id,
        reason=event.reason,
        progress=None if p is None else Progress(step=p.step, index=p.index, of=p.of),
    )


_TOKEN = re.compile(TOKEN_PATTERN)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _token(value: object) -> bool:
    return type(value) is str and _TOKEN.fullmatch(value) is not None


def _count(value: object, least: int) -> bool:
    return type(value) is int and value >= least


def _task_event_body(event: events.TaskEvent) -> bytes | None:
    """`encode(task_event(event))` without the model, or None when a check fails (then the model says why)."""
    p = event.progress
    progress: dict[str, Any] | None = None
    if p is not None:
        step, index, of = p.step, p.index, p.of
        if not (type(step) is str and step and _count(index, 0) and _count(of, 1) and index < of <= MAX_STEPS):
            return None
        progress = {"step": p.step, "index": p.index, "of": p.of}
    if not (
        type(event.task_id) is uuid.UUID
        and isinstance(event.kind, EventKind)
        and isinstance(event.status, TaskStatus)
        and _count(event.seq, 1)
        and (event.attempt is None or _count(event.attempt, 1))
        and (event.host_id is None or _token(event.host_id))
        and (event.device_id is None or _token(event.device_id))
        and (event.reason is None or type(event.reason) is str)
        and event.at.tzinfo is not None
    ):
        return None
    try:
        at = format_timestamp(event.at)
    except OverflowError:  # out of range in UTC: the model refuses it
        return None
    body = {
        "event": event.kind.value,
        "task_id": str(event.task_id),
        "seq": event.seq,
        "attempt": event.attempt,
        "status": event.status.value,
        "at": at,
        "host_id": event.host_id,
        "device_id": event.device_id,
        "reason": event.reason,
        "progress": progress,
    }
    try:
        return _COMPACT(body).encode()
    except UnicodeEncodeError:  # a lone surrogate in the reason: the model refuses it
        return None


def assignment(assigned: events.AttemptAssigned) -> Assignment:
    """The protocol's `Assignment` of a new attempt (its plan was validated at submit, and is again here)."""
    return Assignment(
        task_id=assigned.task_id,
        attempt=assigned.attempt,
        lease_id=assigned.lease_id,
        device_id=assigned.device_id,
        plan=from_jsonable(Plan, assigned.plan),
        ttl_s=assigned.ttl_s,
        expires_at=assigned.expires_at,
    )


def device_event(event: events.DeviceEvent) -> DeviceEventMessage:
    """The protocol's `DeviceEventMessage` of a device quarantined or returned."""
    return DeviceEventMessage(
        event=event.kind,
        device_id=event.device_id,
        host_id=event.host_id,
        at=event.at,
        by=event.by,
        infra_failures=event.infra_failures,
        reason=event.reason,
    )


def outgoing(event: events.DomainEvent, subjects: Subjects, *, ref: int | None = None) -> Outgoing:
    """The message that publishes `event` under `subjects`' prefix.

    `ref`, the event's outbox row id, names a device event's message (`device_event_msg_id`); the other
    events are named by their own fields.

    Raises:
        pydantic.ValidationError: the event does not make a valid protocol message.
        ValueError: a host or device id that is not a subject token, or a device event without `ref`.
    """
    if isinstance(event, events.DeviceEvent):
        if ref is None:
            raise ValueError("a device event's message id needs its outbox id")
        return Outgoing(
            subject=subjects.device_events(event.device_id),
            stream=subjects.events_stream,
            msg_id=device_event_msg_id(event.device_id, ref),
            data=encode(device_event(event)),
        )
    if isinstance(event, events.TaskEvent):
        return Outgoing(
            subject=subjects.task_events(event.task_id),
            stream=subjects.events_stream,
            msg_id=event_msg_id(event.task_id, event.seq),
            data=_task_event_body(event) or encode(task_event(event)),
        )
    return Outgoing(
        subject=subjects.assign(event.host_id),
        stream=subjects.assignments_stream,
        msg_id=assignment_msg_id(event.task_id, event.attempt),
        data=encode(assignment(event)),
    )


def resent(assigned: events.AttemptAssigned, subjects: Subjects, at_ms: int) -> Outgoing:
    """The message that publishes `assigned` again: the first one's, under a message id of its own.

    `at_ms` (Unix milliseconds) makes the id differ from every earlier copy (`assignment_resend_msg_id`).

    Raises:
        pydantic.ValidationError: the event does not make a valid protocol message.
        ValueError: a host id that is not a subject token.
    """
    first = outgoing(assigned, subjects)
    return replace(first, msg_id=assignment_resend_msg_id(assigned.task_id, assigned.attempt, at_ms))
