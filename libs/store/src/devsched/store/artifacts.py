"""Artifacts rows (migration 0007): the checks made before and after an upload, the record, the listing.

A commit is checked twice under the task's row lock: before the scheduler reads the chunks (`admit`: is
this the committing host's live lease, and does the file fit the attempt's cap?) and when it records the
stored object (`record`, the same checks again, so two commits that raced each other cannot pass the cap
together). Both apply the lease rules of a renewal (`devsched.core.leases.decide_renew`): the attempt is
the task's current one, of this host, with this lease id, and its lease is live. So an attempt stores
artifacts until it is reported, released or expired, and never after.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import ArtifactQuotaExceeded, NotFound
from devsched.core.leases import decide_renew
from devsched.core.records import LeaseRef
from devsched.core.views import ArtifactView
from devsched.store.clock import Clock
from devsched.store.rows import lock_task, named_attempt

_OTHERS = text(
    """
    SELECT COALESCE(sum(size), 0) AS total FROM artifacts
    WHERE task_id = :task_id AND attempt = :attempt AND name <> :name
    """
)

_PREVIOUS = text("SELECT object FROM artifacts WHERE task_id = :task_id AND attempt = :attempt AND name = :name")

_UPSERT = text(
    """
    INSERT INTO artifacts (task_id, attempt, name, step, size, sha256, host_id, object, stored_at)
    VALUES (:task_id, :attempt, :name, :step, :size, :sha256, :host_id, :object, :now)
    ON CONFLICT (task_id, attempt, name) DO UPDATE
    SET step = EXCLUDED.step, size = EXCLUDED.size, sha256 = EXCLUDED.sha256, host_id = EXCLUDED.host_id,
        object = EXCLUDED.object, stored_at = EXCLUDED.stored_at
    RETURNING stored_at
    """
)

_LIST = text(
    """
    SELECT attempt, name, step, size, sha256, host_id, stored_at, object FROM artifacts
    WHERE task_id = :task_id AND (CAST(:attempt AS integer) IS NULL OR attempt = :attempt)
    ORDER BY attempt, name
    """
)

_TASK = text("SELECT 1 FROM tasks WHERE task_id = :task_id")


async def admit(
    conn: AsyncConnection, clock: Clock, ref: LeaseRef, name: str, size: int, max_attempt_bytes: int
) -> None:
    """Check that `ref` is the live lease of its host and that `size` more bytes under `name` fit the cap.

    Raises:
        NotFound, LeaseForeign, LeaseSuperseded, TaskTerminal, LeaseExpired: as a renewal would.
        ArtifactQuotaExceeded: the attempt's other artifacts and this one exceed `max_attempt_bytes`.
    """
    task = await lock_task(conn, ref.task_id)
    now = await clock.now(conn)
    named, _ = await named_attempt(conn, task, ref.attempt)
    decide_renew(task, named, ref, now)
    params = {"task_id": ref.task_id, "attempt": ref.attempt, "name": name}
    others = int((await conn.execute(_OTHERS, params)).scalar_one())
    if others + size > max_attempt_bytes:
        raise ArtifactQuotaExceeded(
            f"the attempt's artifacts would total {others + size} bytes with {name!r}, above the per-attempt "
            f"cap of {max_attempt_bytes} bytes",
            limit=max_attempt_bytes,
            stored=others,
            size=size,
        )


async def record(
    conn: AsyncConnection,
    clock: Clock,
    ref: LeaseRef,
    artifact: ArtifactView,
    max_attempt_bytes: int,
) -> tuple[ArtifactView, str | None]:
    """Record a stored object as the attempt's artifact `artifact.name` (after `admit`'s checks, again).

    Returns the row as stored, and the object it replaced (to delete from the bucket), if any.
    """
    await admit(conn, clock, ref, artifact.name, artifact.size, max_attempt_bytes)
    now = await clock.now(conn)
    params = {"task_id": ref.task_id, "attempt": ref.attempt, "name": artifact.name}
    previous = (await conn.execute(_PREVIOUS, params)).scalar_one_or_none()
    stored_at: datetime = (
        await conn.execute(
            _UPSERT,
            {
                **params,
                "step": artifact.step,
                "size": artifact.size,
                "sha256": artifact.sha256,
                "host_id": ref.host_id,
                "object": artifact.object,
                "now": now,
            },
        )
    ).scalar_one()
    row = ArtifactView(
        attempt=ref.attempt,
        name=artifact.name,
        step=artifact.step,
        size=artifact.size,
        sha256=artifact.sha256,
        host_id=ref.host_id,
        stored_at=stored_at,
        object=artifact.object,
    )
    return row, (previous if previous is not None and previous != artifact.object else None)


async def list_artifacts(conn: AsyncConnection, task_id: uuid.UUID, attempt: int | None) -> tuple[ArtifactView, ...]:
    """The task's artifacts (of one attempt, or all), by attempt then name.

    Raises:
        NotFound: no such task.
    """
    rows = (await conn.execute(_LIST, {"task_id": task_id, "attempt": attempt})).all()
    if not rows and (await conn.execute(_TASK, {"task_id": task_id})).first() is None:
        raise NotFound(f"no task {task_id}", task_id=str(task_id))
    return tuple(
        ArtifactView(
            attempt=r.attempt,
            name=r.name,
            step=r.step,
            size=r.size,
            sha256=r.sha256,
            host_id=r.host_id,
            stored_at=r.stored_at,
            object=r.object,
        )
        for r in rows
    )
