"""The database itself refuses to break ARCHITECTURE.md's invariants, whatever code writes to it."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from devsched.store import Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def _violates(store: Store, sql: str, constraint: str, **params: object) -> None:
    async with store.engine.connect() as conn:
        with pytest.raises(sqlalchemy.exc.IntegrityError, match=constraint):
            await conn.execute(text(sql), params)
        await conn.rollback()


async def test_a_device_has_at_most_one_active_reservation(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    other = await lab.submit()
    await _violates(
        lab.store,
        """
        INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at)
        VALUES (:t, 1, gen_random_uuid(), 'h1', 'd1', 'active', now(), now())
        """,
        "uq_attempts_one_active_per_device",
        t=other,
    )
    assert lease.attempt == 1


async def test_attempt_numbers_have_no_gaps_and_one_is_active(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(device_id="d1")
    ended = """
        INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at,
                              ended_at, end_reason)
        VALUES (:t, :n, gen_random_uuid(), 'h1', 'd2', 'expired', now(), now(), now(), 'lease_expired')
    """
    await _violates(lab.store, ended, "fk_attempts_previous", t=lease.task_id, n=3)
    active = """
        INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at)
        VALUES (:t, :n, gen_random_uuid(), 'h1', 'd2', 'active', now(), now())
    """
    await _violates(lab.store, active, "uq_attempts_one_active_per_task", t=lease.task_id, n=2)


async def test_reservation_follows_its_attempt(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    async with lab.store.engine.begin() as conn:
        await conn.execute(
            text("UPDATE attempts SET status = 'failed', end_reason = 'failed', ended_at = now() WHERE task_id = :t"),
            {"t": lease.task_id},
        )
        status = (
            await conn.execute(text("SELECT attempt_status FROM reservations WHERE task_id = :t"), {"t": lease.task_id})
        ).scalar_one()
        await conn.rollback()
    assert status == "failed", "ending the attempt released the reservation in the same statement"
    for sql in ("UPDATE reservations SET attempt_status = 'done' WHERE task_id = :t",
                "DELETE FROM reservations WHERE task_id = :t"):  # fmt: skip
        async with lab.store.engine.connect() as conn:
            with pytest.raises(sqlalchemy.exc.DBAPIError, match="a reservation is its attempt"):
                await conn.execute(text(sql), {"t": lease.task_id})
            await conn.rollback()
    async with lab.store.engine.connect() as conn:
        active = await conn.execute(
            text("SELECT attempt_status FROM reservations WHERE task_id = :t"), {"t": lease.task_id}
        )
        assert active.scalar_one() == "active", "a refused write changed nothing"


async def test_an_older_release_writing_a_reservation_beside_its_attempt_still_assigns(lab: Lab) -> None:
    """During a rolling update an older scheduler inserts a reservation with each attempt: taken, and dropped."""
    await lab.host("h1", "d1", "d2")
    busy = await lab.running(device_id="d1")
    task = await lab.submit()
    older = """
        WITH a AS (INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at,
                                         expires_at)
                   VALUES (:t, 1, gen_random_uuid(), 'h1', :d, 'active', now(), now()) RETURNING 1)
        INSERT INTO reservations (task_id, attempt, device_id, attempt_status, created_at)
        VALUES (:t, 1, :d, 'active', now())
    """
    async with lab.store.engine.connect() as conn:
        with pytest.raises(sqlalchemy.exc.IntegrityError, match="uq_attempts_one_active_per_device"):
            await conn.execute(text(older), {"t": task, "d": "d1"})
        await conn.rollback()
    async with lab.store.engine.begin() as conn:
        await conn.execute(text(older), {"t": task, "d": "d2"})
        rows = (await conn.execute(text("SELECT task_id, device_id, attempt_status FROM reservations"))).all()
    assert sorted((str(r.task_id), r.device_id, r.attempt_status) for r in rows) == sorted(
        [(str(busy.task_id), "d1", "active"), (str(task), "d2", "active")]
    )


async def test_attempt_count_never_exceeds_max_attempts(lab: Lab) -> None:
    task = await lab.submit(max_attempts=2)
    await _violates(
        lab.store, "UPDATE tasks SET attempt_count = 3 WHERE task_id = :t", "ck_tasks_attempt_count", t=task
    )


async def test_ended_attempts_keep_their_end_reason(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    await _violates(
        lab.store,
        "UPDATE attempts SET status = 'expired', ended_at = now() WHERE task_id = :t",
        "ck_attempts_end_reason_iff_ended",
        t=lease.task_id,
    )
    await _violates(
        lab.store,
        "UPDATE attempts SET status = 'done', end_reason = 'failed', ended_at = now() WHERE task_id = :t",
        "ck_attempts_end_reason_matches",
        t=lease.task_id,
    )


async def test_cancellation_requests_belong_to_an_attempt(lab: Lab) -> None:
    task = await lab.submit()
    await _violates(
        lab.store,
        "INSERT INTO cancel_requests (task_id, attempt, requested_at) VALUES (:t, 1, now())",
        "fk_cancel_requests_attempt",
        t=task,
    )
    assert isinstance(task, uuid.UUID)


async def test_statuses_outside_their_lists_are_refused(lab: Lab) -> None:
    """The status lists (stored as array constants since 0014) still refuse every name not in them."""
    await lab.host("h1", "d1")
    lease = await lab.running()
    t = lease.task_id
    await _violates(lab.store, "UPDATE tasks SET status = 'running' WHERE task_id = :t", "ck_tasks_status", t=t)
    await _violates(lab.store, "UPDATE tasks SET kind = 'system' WHERE task_id = :t", "ck_tasks_kind", t=t)
    queued = await lab.submit()
    await _violates(
        lab.store, "UPDATE tasks SET status = 'dispatched' WHERE task_id = :t", "ck_tasks_in_flight_has_attempt",
        t=queued,
    )  # fmt: skip
    await _violates(
        lab.store,
        "UPDATE attempts SET status = 'lease_expired', end_reason = 'lease_expired', ended_at = now()"
        " WHERE task_id = :t",
        "ck_attempts_status",
        t=t,
    )  # every other check passes: an end reason is no status
    await _violates(
        lab.store,
        "UPDATE attempts SET status = 'expired', end_reason = 'done', ended_at = now() WHERE task_id = :t",
        "ck_attempts_end_reason_matches",
        t=t,
    )
    await _violates(
        lab.store,
        "UPDATE attempts SET status = 'failed', end_reason = 'crashed', ended_at = now() WHERE task_id = :t",
        '"ck_attempts_end_reason"',
        t=t,
    )


async def test_an_idempotency_key_is_held_by_one_task_only(lab: Lab) -> None:
    """Only the keys that are set are indexed (0014); a set key is still unique, however the row is written."""
    first, second = await lab.submit(), await lab.submit()
    async with lab.store.engine.begin() as conn:
        await conn.execute(text("UPDATE tasks SET idempotency_key = 'k' WHERE task_id = :t"), {"t": first})
    await _violates(
        lab.store, "UPDATE tasks SET idempotency_key = 'k' WHERE task_id = :t", "uq_tasks_idempotency_key", t=second
    )
    async with lab.store.engine.connect() as conn:
        keyless = await conn.scalar(text("SELECT count(*) FROM tasks WHERE idempotency_key IS NULL"))
    assert keyless == 1  # tasks without a key are many, and never collide
