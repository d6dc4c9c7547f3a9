"""Builders of core records for the unit tests: a task with its attempts, and the refs hosts send."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from devsched.core.records import AttemptRecord, LeaseRef, TaskRecord
from devsched.core.status import AttemptStatus, TaskStatus

#: A fixed "database clock" reading; tests move from it with `timedelta`s.
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
HOST = "host-a"
OTHER_HOST = "host-b"
DEVICE = "dev-1"
TTL = 30


def attempt(
    n: int = 1,
    *,
    status: AttemptStatus = AttemptStatus.ACTIVE,
    expires_at: datetime | None = None,
    host_id: str = HOST,
    device_id: str = DEVICE,
    lease_id: uuid.UUID | None = None,
    dispatched: bool = False,
) -> AttemptRecord:
    """Attempt `n`, by default active on `HOST` with a lease expiring one ttl after `T0`."""
    return AttemptRecord(
        attempt=n,
        lease_id=lease_id or uuid.uuid4(),
        host_id=host_id,
        device_id=device_id,
        status=status,
        expires_at=expires_at or T0 + timedelta(seconds=TTL),
        dispatched=dispatched,
    )


def task(
    status: TaskStatus = TaskStatus.ASSIGNED,
    current: AttemptRecord | None = None,
    *,
    attempt_count: int | None = None,
    max_attempts: int = 3,
    lease_ttl_s: int = TTL,
    cancel_requested: bool = False,
    releases: int = 0,
) -> TaskRecord:
    """A task whose newest attempt is `current` (attempt_count follows it unless given)."""
    if attempt_count is None:
        attempt_count = current.attempt if current is not None else 0
    return TaskRecord(
        task_id=uuid.uuid4(),
        status=status,
        attempt_count=attempt_count,
        max_attempts=max_attempts,
        lease_ttl_s=lease_ttl_s,
        current=current,
        cancel_requested=cancel_requested,
        releases=releases,
    )


def in_flight(
    status: TaskStatus = TaskStatus.ASSIGNED,
    *,
    n: int = 1,
    max_attempts: int = 3,
    cancel_requested: bool = False,
    **attempt_kw: object,
) -> TaskRecord:
    """An assigned (or dispatched) task whose current attempt `n` is active on `HOST`."""
    cur = attempt(n, dispatched=status is TaskStatus.DISPATCHED, **attempt_kw)  # type: ignore[arg-type]
    return task(status, cur, max_attempts=max_attempts, cancel_requested=cancel_requested)


def expired_as(status: TaskStatus) -> TaskRecord:
    """A task whose only attempt ended as expired, leaving the task in `status`."""
    return task(status, attempt(1, status=AttemptStatus.EXPIRED))


def ref_for(t: TaskRecord, a: AttemptRecord | None = None, **changes: object) -> LeaseRef:
    """The ref the owner of attempt `a` (default: the current one) sends, with `changes` applied."""
    a = a or t.current
    assert a is not None
    ref = LeaseRef(host_id=a.host_id, task_id=t.task_id, attempt=a.attempt, lease_id=a.lease_id)
    return replace(ref, **changes)  # type: ignore[arg-type]
