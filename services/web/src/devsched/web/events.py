"""Reading one task's stored events for its page (the `<PU>_EVENTS` stream), without waiting for more.

`Client.watch` follows a task until it ends; a page wants what is stored now and nothing else: an ordered
consumer from the start, read until the stream says nothing is pending.
"""

from __future__ import annotations

import contextlib
import uuid

import nats.errors
from nats.js.api import DeliverPolicy

from devsched.client import Client, DevschedError
from devsched.protocol.codec import decode
from devsched.protocol.messages import TaskEvent

#: Seconds to wait for the next stored event before giving up (a task whose events have aged out).
READ_WAIT_S = 0.5
#: Most events read for one page.
MOST = 1000


async def stored_events(client: Client, task_id: uuid.UUID) -> list[TaskEvent]:
    """The task's events now in the stream, by `seq`, each once; empty if the stream has none or is missing."""
    js = client.nc.jetstream()
    try:
        sub = await js.subscribe(
            client.subjects.task_events(task_id),
            stream=client.subjects.events_stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
    except (nats.errors.Error, OSError):
        return []
    events: dict[int, TaskEvent] = {}
    try:
        while len(events) < MOST:
            try:
                msg = await sub.next_msg(timeout=READ_WAIT_S)
            except (nats.errors.Error, OSError):
                break
            with contextlib.suppress(DevschedError):
                event = decode(TaskEvent, msg.data)
                events.setdefault(event.seq, event)
            if msg.metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return [events[seq] for seq in sorted(events)]
