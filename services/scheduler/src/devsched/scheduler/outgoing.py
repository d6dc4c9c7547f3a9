"""What each domain event is on the wire: the protocol's model, its subject, stream and message id.

The one place where a `devsched.core.events` value becomes a JetStream message, for the outbox relay and
for the resync, which publishes an unclaimed attempt's assignment again (`resent`). The body is the
protocol's model built from the value by its field names (`WireModel.encode_value`, the relay's per-message
path), so nothing malformed reaches a host or a watcher, and a field added to both is published as is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from devsched.core import events
from devsched.protocol.events import Assignment, DeviceEventMessage, TaskEvent
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
            data=DeviceEventMessage.encode_value(event),
        )
    if isinstance(event, events.TaskEvent):
        return Outgoing(
            subject=subjects.task_events(event.task_id),
            stream=subjects.events_stream,
            msg_id=event_msg_id(event.task_id, event.seq),
            data=TaskEvent.encode_value(event),
        )
    return Outgoing(
        subject=subjects.assign(event.host_id),
        stream=subjects.assignments_stream,
        msg_id=assignment_msg_id(event.task_id, event.attempt),
        data=Assignment.encode_value(event),
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
