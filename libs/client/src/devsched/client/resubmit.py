"""Resubmit: a new task with an ended (or running) task's plan, selector and options.

One definition for `devsched resubmit` and the dashboard's Resubmit button: the task is read with
`P.api.tasks.get` and a new one is sent with `P.api.tasks.submit`, so whoever may submit may resubmit, and
nobody else. The new task gets its own idempotency key (the client makes one): the old key would return the
old task. A deadline is a point in time: it is carried over only while it is still ahead. The new task's
metadata names the task it repeats (`RESUBMIT_OF`): the link the dashboard's Task page shows.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from devsched.client.errors import from_validation, invalid
from devsched.core.status import TaskKind
from devsched.protocol.tasks import SubmitRequest, TaskView

if TYPE_CHECKING:
    from devsched.client.client import Client, TaskId
    from devsched.protocol.tasks import SubmitReply

#: The metadata key of a resubmitted task holding the id of the task it repeats (of a resubmit's resubmit,
#: the resubmit it repeats: the chain is followed one task at a time).
RESUBMIT_OF = "resubmit_of"


def resubmit_of(metadata: dict[str, Any]) -> uuid.UUID | None:
    """The task that a task's metadata says it repeats (`RESUBMIT_OF`); None when it names none."""
    value = metadata.get(RESUBMIT_OF)
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def resubmit_request(view: TaskView, now: datetime) -> SubmitRequest:
    """The submit request that repeats `view`: same plan, selector, name, priority, limits and metadata.

    The metadata gains `RESUBMIT_OF` (`view`'s id), unless that would take it past its size limit: the
    task is then repeated without the link rather than not at all.

    Raises:
        InvalidRequest: the task is a health check (the scheduler runs those, nobody submits them), its
            metadata was cut from the view (read it with `full=["metadata"]` first), or it breaks a limit
            of today's protocol.
    """
    if view.kind == TaskKind.HEALTH:
        raise invalid("task_id", "a health check is run by the scheduler: it cannot be resubmitted")
    if "metadata" in view.truncated:
        raise invalid("task_id", "the task's metadata was cut from the view: read it whole first")
    fields: dict[str, Any] = {
        "name": view.name,
        "selector": view.selector,
        "plan": view.plan,
        "priority": view.priority,
        "max_attempts": view.max_attempts,
        "lease_ttl_s": view.lease_ttl_s,
        "metadata": view.metadata,
        "retry": view.retry,
        "queue_timeout_s": view.queue_timeout_s,
        "attempt_timeout_s": view.attempt_timeout_s,
        "deadline": view.deadline if view.deadline is not None and view.deadline > now else None,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    try:
        return SubmitRequest.model_validate({**fields, "metadata": {**view.metadata, RESUBMIT_OF: str(view.task_id)}})
    except ValidationError:
        pass  # the link does not fit, or the task breaks a limit: the request without the link says which
    try:
        return SubmitRequest.model_validate(fields)
    except ValidationError as exc:
        raise from_validation(exc) from None


async def resubmit(client: Client, task_id: TaskId, now: datetime) -> SubmitReply:
    """Submit a new task repeating task `task_id` (a whole id); the new task's reply.

    Raises:
        NotFound: no such task.
        InvalidRequest: a health check, or a request the scheduler refuses today (a limit tightened since).
    """
    view = await client.get(task_id)
    if "metadata" in view.truncated:
        view = await client.get(task_id, full=["metadata"])
    return await client.submit(resubmit_request(view, now))
