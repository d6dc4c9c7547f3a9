"""Timeouts, cancellation and outages: the pool stays healthy and errors are typed and retryable."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from devsched.core.errors import Unavailable
from devsched.store import DatabaseTimeouts, NewTask, Store
from support.servers import PostgresHandle
from support.store_lab import Lab

pytestmark = pytest.mark.integration

PLAN = {"steps": [{"name": "s", "action": "noop", "args": {}}]}


async def test_sessions_carry_statement_lock_and_idle_timeouts(database_url: str) -> None:
    store = Store.connect(database_url, timeouts=DatabaseTimeouts(statement_s=7, lock_s=3, idle_in_transaction_s=11))
    try:
        async with store.engine.connect() as conn:
            values = [
                (await conn.execute(text(f"SHOW {name}"))).scalar_one()
                for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
            ]
    finally:
        await store.close()
    assert values == ["7s", "3s", "11s"]


async def test_cancelled_callers_never_return_a_broken_connection(lab: Lab) -> None:
    """Cancel submits at random points mid-flight; every one either committed whole or not at all."""
    pool = lab.store.engine.pool
    submitted = 0
    for i in range(40):
        task = asyncio.ensure_future(lab.store.submit(NewTask(plan=PLAN, idempotency_key=f"k{i}")))
        await asyncio.sleep(0.0005 * (i % 8))
        if task.cancel():
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            submitted += 1
    # every connection went back to the pool, usable
    assert pool.checkedout() == 0  # type: ignore[attr-defined]
    page = await lab.store.list_tasks(limit=1000)
    keys = {t.idempotency_key for t in page.tasks}
    assert len(keys) >= submitted
    async with lab.store.engine.connect() as conn:
        events = (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar_one()
    assert events == len(page.tasks), "each task that exists has its submitted event: nothing half-applied"
    for _ in range(10):
        await lab.store.submit(NewTask(plan=PLAN))


async def test_database_outage_is_unavailable_then_recovers(postgres_server: PostgresHandle, database_url: str) -> None:
    store = Store.connect(database_url, timeouts=DatabaseTimeouts(connect_s=2))
    try:
        await store.submit(NewTask(plan=PLAN))
        postgres_server.stop()
        try:
            with pytest.raises(Unavailable) as err:
                await store.submit(NewTask(plan=PLAN))
            assert err.value.retryable
        finally:
            postgres_server.start()
        await store.submit(NewTask(plan=PLAN))  # the pool replaced its dead connections
        assert len((await store.list_tasks()).tasks) == 2
    finally:
        await store.close()


async def test_losing_a_unique_race_is_retried_not_an_error(lab: Lab) -> None:
    """Force the race the assigners can lose: a reservation that appears between the read and the insert."""
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncConnection

    calls = 0

    async def insert_twice(conn: AsyncConnection, now: datetime) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first run collides with a row that another session committed meanwhile
            await conn.execute(
                text(
                    "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, "
                    "created_at, updated_at, idempotency_key) VALUES (gen_random_uuid(), 'queued', "
                    "0, 1, 1, '{}', now(), now(), 'dup'), (gen_random_uuid(), 'queued', 0, 1, 1, "
                    "'{}', now(), now(), 'dup')"
                )
            )
        return calls

    assert await lab.store._tx.run(insert_twice, name="race") == 2
