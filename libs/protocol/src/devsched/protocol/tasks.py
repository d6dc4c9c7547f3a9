"""Operator/client endpoints on tasks: `P.api.tasks.submit|get|list|cancel`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from devsched.core.limits import (
    LEASE_TTL_DEFAULT_S,
    LEASE_TTL_MAX_S,
    LEASE_TTL_MIN_S,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    LIST_LIMIT_MIN,
    MAX_ATTEMPTS_DEFAULT,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    PRIORITY_DEFAULT,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from devsched.core.status import AttemptStatus, EndReason, TaskKind, TaskStatus
from devsched.protocol.artifacts import ArtifactView
from devsched.protocol.base import (
    BoundedJsonObject,
    Cursor,
    Id,
    JsonObject,
    Lax,
    Reason,
    ReplyModel,
    RequestModel,
    ShortName,
    Timestamp,
    Token,
)
from devsched.protocol.plans import Plan, Progress, RunResult, Selector
from devsched.protocol.policies import Limit, RetryPolicy

__all__ = [
    "TASK_ID_PREFIX_PATTERN",
    "AttemptView",
    "CancelReply",
    "CancelRequest",
    "GetTaskRequest",
    "ListTasksReply",
    "ListTasksRequest",
    "SubmitReply",
    "SubmitRequest",
    "TaskSummary",
    "TaskView",
    "TrimmedField",
]


def _unless_none(value: object) -> bool:
    # Fields added to the task view are left out when null, so a task that does not use them is shown
    # exactly as before (as a step's `results`).
    return value is None


def _unless_empty(value: list[str] | None) -> bool:
    return not value


#: The start of a task id as it is written (lowercase, its hyphens in place), cut anywhere after its 8th digit:
#: `3af5939c`, `3af5939c-1b`, up to the whole id.
TASK_ID_PREFIX_PATTERN = (
    r"^[0-9a-f]{8}(-([0-9a-f]{0,3}|[0-9a-f]{4}(-([0-9a-f]{0,3}|[0-9a-f]{4}(-([0-9a-f]{0,3}|[0-9a-f]{4}"
    r"(-[0-9a-f]{0,12})?))?))?))?$"
)
TaskIdPrefix = Annotated[str, StringConstraints(pattern=TASK_ID_PREFIX_PATTERN)]

#: A large field of a task that a reply may cut to fit (see `TaskSummary.truncated`): `metadata` (left
#: empty), `result` (each step's `output_tail` cut to its end, or left out), `attempts` (each attempt's
#: `result` left out), `artifacts` (the list left empty: `P.api.tasks.artifacts` pages it).
TrimmedField = Literal["metadata", "result", "attempts", "artifacts"]


class SubmitRequest(RequestModel):
    """`P.api.tasks.submit`: a new task. Only `plan` is required."""

    name: ShortName | None = None
    """A label for people; not unique. At most 200 characters."""
    selector: Selector = Field(default_factory=Selector)
    """Which devices may run it; any device by default."""
    plan: Plan
    """The steps to run."""
    priority: int = Field(default=PRIORITY_DEFAULT, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    """Higher runs first; ties go to the oldest submit (a requeued task keeps its place)."""
    max_attempts: int = Field(default=MAX_ATTEMPTS_DEFAULT, ge=MAX_ATTEMPTS_MIN, le=MAX_ATTEMPTS_MAX)
    """How many attempts (leases) the task may use before a lease expiry fails it."""
    lease_ttl_s: int = Field(default=LEASE_TTL_DEFAULT_S, ge=LEASE_TTL_MIN_S, le=LEASE_TTL_MAX_S)
    """How long a lease lasts without renewal, in whole seconds."""
    idempotency_key: ShortName | None = None
    """A repeated key returns the existing task with `created: false` and creates nothing. At most 200 characters."""
    metadata: BoundedJsonObject = Field(default_factory=dict)
    """Free-form data kept with the task: at most 64 KiB of compact JSON."""
    retry: RetryPolicy | None = None
    """Addition: which failures are retried, with which backoff; null keeps the behaviour without a policy
    (expiries and releases retried at once, a failed report final)."""
    queue_timeout_s: Limit | None = None
    """Addition: the task fails (`queue_timeout`) when no device took it this long after it entered the queue."""
    attempt_timeout_s: Limit | None = None
    """Addition: an attempt running this long is stopped like a cancellation and ends `failed`
    (`attempt_timeout`), or is retried if the policy says `attempt_timeout`."""
    deadline: Timestamp | None = None
    """Addition: the task fails (`deadline_exceeded`) if it has not ended by then, across all attempts. A
    deadline already past is accepted: the task fails at the next sweep."""


class SubmitReply(ReplyModel):
    """Answer to a submit."""

    task_id: Id
    """The new (or, for a repeated idempotency key, the existing) task."""
    status: Lax[TaskStatus]
    """The task's status now: `queued` for a new task."""
    created: bool
    """False when an earlier submit with the same idempotency key created the task."""


class GetTaskRequest(RequestModel):
    """`P.api.tasks.get`: one task with its attempts."""

    task_id: Id
    """The task to show."""
    full: list[TrimmedField] | None = Field(default=None, max_length=4, exclude_if=_unless_none)
    """Addition: fields to show whole even in a view too large for one reply (the others are cut first to
    make room); a view that still does not fit is answered `reply_too_large`. Left out when null."""


class AttemptView(ReplyModel):
    """One attempt of a task: a lease on one device, kept for audit after it ends."""

    attempt: int = Field(ge=1)
    """1, 2, 3, ... with no gaps."""
    lease_id: Id
    """The lease's id: a fencing token that external systems can compare."""
    host_id: Token
    """The host that owns the device."""
    device_id: Token
    """The reserved device."""
    status: Lax[AttemptStatus]
    """`active`, `expired`, `done`, `failed`, `cancelled` or (an addition) `released`."""
    assigned_at: Timestamp
    """When the scheduler created the attempt."""
    dispatched_at: Timestamp | None = None
    """When the host claimed it; null until then."""
    expires_at: Timestamp
    """When the lease runs out (database clock) unless renewed."""
    ended_at: Timestamp | None = None
    """When the attempt ended; null while active."""
    end_reason: Lax[EndReason] | None = None
    """`done`, `failed`, `cancelled` (reported), `lease_expired` or (an addition) `released`; null while active."""
    progress: Progress | None = None
    """The latest progress the host renewed with."""
    cancel_requested: bool = False
    """Whether a cancellation request was recorded against this attempt (an addition)."""
    report_reason: str | None = None
    """The reason the host gave in its report, if it reported (an addition)."""
    result: JsonObject | None = None
    """The result metadata the host reported, if it reported (an addition)."""


class TaskSummary(ReplyModel):
    """A task as `P.api.tasks.list` shows it: the task view without attempts."""

    task_id: Id
    """The task's id."""
    name: str | None = None
    """The submitted name."""
    status: Lax[TaskStatus]
    """Where the task is in its lifecycle."""
    priority: int
    """The submitted priority."""
    max_attempts: int
    """The submitted attempt limit."""
    attempt_count: int
    """Attempts made so far (the newest attempt's number), released ones included."""
    cancel_requested: bool
    """Whether a cancellation request is pending against the current attempt."""
    selector: Selector
    """The submitted selector."""
    plan: Plan
    """The submitted plan."""
    created_at: Timestamp
    """Submit time; the queue order among equal priorities."""
    updated_at: Timestamp
    """Last change of the task row."""
    reason: str | None = None
    """Why the task ended: the agent's reason, or `lease_expired`, `cancelled_while_queued`,
    `cancelled_after_lease_expired`, `cancelled_after_release`, `released_too_often`."""
    result: RunResult | None = None
    """The result of the report that ended the task."""
    pending_reason: str | None = None
    """While queued: why it waits (no online device matches, every match is busy, ...)."""
    lease_ttl_s: int | None = None
    """Addition: the submitted lease ttl."""
    idempotency_key: str | None = None
    """Addition: the submitted idempotency key."""
    metadata: JsonObject = Field(default_factory=dict)
    """Addition: the submitted metadata."""
    releases: int = Field(default=0, ge=0)
    """Addition: attempts its hosts gave back (`released`), which do not count against `max_attempts`."""
    retry: RetryPolicy | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the retry policy with its defaults filled in; left out when the task has none."""
    queue_timeout_s: float | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the submitted queue timeout; left out when none."""
    attempt_timeout_s: float | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the submitted attempt timeout; left out when none."""
    deadline: Timestamp | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the submitted deadline; left out when none."""
    not_before: Timestamp | None = Field(default=None, exclude_if=_unless_none)
    """Addition: while a retried task waits out its backoff, when it may run again; left out otherwise."""
    kind: Lax[TaskKind] = TaskKind.USER
    """Addition (issue 13): `user`, or `health`: a health check the scheduler ran on one device."""
    health_device_id: str | None = Field(default=None, exclude_if=_unless_none)
    """Addition: the device a `health` task checks; left out for user tasks."""
    truncated: list[TrimmedField] = Field(default_factory=list, exclude_if=_unless_empty)
    """Addition: the fields cut so that the reply fits NATS's `max_payload` (a list cuts `metadata` and
    `result` above a few KiB); `P.api.tasks.get` with `full` shows them whole. Left out when nothing is cut."""


class TaskView(TaskSummary):
    """`P.api.tasks.get` reply: the task and every attempt, oldest first."""

    attempts: list[AttemptView] = Field(default_factory=list)
    """Every attempt, oldest first."""
    artifacts: list[ArtifactView] = Field(default_factory=list, exclude_if=lambda artifacts: not artifacts)
    """Addition: the stored artifacts of every attempt, by attempt then name (issue 12)."""


class ListTasksRequest(RequestModel):
    """`P.api.tasks.list`: one page of tasks, newest first."""

    status: Lax[TaskStatus] | None = None
    """Only tasks in this status; all statuses when null."""
    limit: int = Field(default=LIST_LIMIT_DEFAULT, ge=LIST_LIMIT_MIN, le=LIST_LIMIT_MAX)
    """Page size, 1 to 1000."""
    after: Cursor | None = None
    """The `next` cursor of the previous page; null for the first page."""
    kind: Lax[TaskKind] | None = Field(default=None, exclude_if=_unless_none)
    """Addition (issue 13): only `user` tasks or only `health` tasks; both when null (left out)."""
    device_id: Token | None = Field(default=None, exclude_if=_unless_none)
    """Addition (issue 15): only tasks that had an attempt on this device; every task when null (left out)."""
    id_prefix: TaskIdPrefix | None = Field(default=None, exclude_if=_unless_none)
    """Addition: only tasks whose id starts with this (8 or more hex digits, lowercase, hyphens where the id
    has them), so that a client can take a short id; every task when null (left out)."""


class ListTasksReply(ReplyModel):
    """One page of tasks."""

    tasks: list[TaskSummary]
    """The page, newest first."""
    next: str | None = None
    """Opaque cursor for the next page; null on the last page. A page also ends early, with a cursor, when
    one more task would make the reply larger than NATS's `max_payload` (an addition)."""


class CancelRequest(RequestModel):
    """`P.api.tasks.cancel`: cancel now if queued, else request a stop from the host."""

    task_id: Id
    """The task to cancel."""
    reason: Reason | None = None
    """Kept on the cancellation request and carried by the `cancel_requested` event. At most 1024 characters."""


class CancelReply(ReplyModel):
    """Answer to a cancel."""

    task_id: Id
    """The task."""
    status: Lax[TaskStatus]
    """The task's status after the request."""
    cancel_requested: bool
    """True while a stop is pending with the host; false when nothing is pending."""
