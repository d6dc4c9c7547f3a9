"""Pruning ended history (migration 0006's `devsched_prune`, `Store.prune`) against the real Postgres.

What goes: an ended task older than the retention, with its attempts, reservation, cancellation request,
artifacts rows (migration 0007) and sent outbox rows. What stays: younger ended tasks, queued and running
tasks however old, unsent outbox rows. The database's rule is checked against core's
(`devsched.core.retention.prunable`) on a random mix, and two pruners side by side take different tasks.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from devsched.core.retention import prunable
from devsched.core.status import Outcome, TaskStatus
from devsched.core.views import ArtifactView
from devsched.store import Store
from support.outbox_rows import ALL_PUBLISHED
from support.store_lab import Lab

pytestmark = pytest.mark.integration

KEEP = timedelta(days=30)
_TABLES = ("tasks", "attempts", "reservations", "cancel_requests", "artifacts")


async def age(store: Store, task_id: uuid.UUID, *, created_days: float, updated_days: float) -> None:
    """Move a task's creation and last change into the past (the database's clock)."""
    async with store.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE tasks SET created_at = now() - make_interval(secs => :c),"
                " updated_at = now() - make_interval(secs => :u) WHERE task_id = :t"
            ),
            {"c": created_days * 86400, "u": updated_days * 86400, "t": task_id},
        )


async def rows_of(store: Store, task_id: uuid.UUID) -> dict[str, int]:
    """How many rows of each table belong to the task (its outbox rows by their `task_id`)."""
    counts: dict[str, int] = {}
    async with store.engine.connect() as conn:
        for table in _TABLES:
            counts[table] = (
                await conn.execute(text(f"SELECT count(*) FROM {table} WHERE task_id = :t"), {"t": task_id})
            ).scalar_one()
        counts["outbox"] = (
            await conn.execute(text("SELECT count(*) FROM outbox WHERE data->>'task_id' = :t"), {"t": str(task_id)})
        ).scalar_one()
    return counts


async def mark_all_sent(store: Store) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(text(ALL_PUBLISHED))


async def cancelled_while_running(lab: Lab) -> uuid.UUID:
    """A task with an attempt, a reservation, a cancellation request, an artifact (issue 12) and events:
    cancelled by its host."""
    lease = await lab.running()
    artifact = ArtifactView(1, "a.bin", "s", 3, "0" * 64, lease.host_id, datetime.now(UTC), f"{lease.task_id}/1/u")
    await lab.store.record_artifact(lease, artifact, max_attempt_bytes=100)
    await lab.store.request_cancel(lease.task_id, "no longer needed")
    await lab.store.report(lease, Outcome.CANCELLED, reason="cancelled")
    return lease.task_id


async def test_an_old_ended_task_goes_with_everything_that_is_its_own(lab: Lab, store: Store) -> None:
    await lab.host("h1", "d1")
    old = await cancelled_while_running(lab)
    young = await cancelled_while_running(lab)
    await mark_all_sent(store)
    before = await rows_of(store, old)
    assert all(before.values()), before  # every kind of row exists, so its removal is seen
    await age(store, old, created_days=40, updated_days=31)
    await age(store, young, created_days=40, updated_days=29)

    assert await store.prune(KEEP) == 1

    assert set((await rows_of(store, old)).values()) == {0}
    assert await rows_of(store, young) == before | {"outbox": (await rows_of(store, young))["outbox"]}
    assert (await store.get_task(young)).status is TaskStatus.CANCELLED
    assert await store.prune(KEEP) == 0


async def test_queued_and_running_tasks_stay_however_old_and_unsent_events_stay(lab: Lab, store: Store) -> None:
    await lab.host("h1", "d1", "d2")
    ended = await cancelled_while_running(lab)
    running = (await lab.running()).task_id
    queued = await lab.submit(labels={"platform": "none"})  # no device matches: it waits
    for task_id in (running, queued, ended):
        await age(store, task_id, created_days=400, updated_days=400)
    outbox_before = (await rows_of(store, ended))["outbox"]
    assert outbox_before > 0  # none of them was sent

    assert await store.prune(KEEP) == 1  # the ended task itself goes ...

    assert (await rows_of(store, ended))["outbox"] == outbox_before  # ... its unsent events stay for the relay
    assert (await store.get_task(running)).status is TaskStatus.DISPATCHED
    assert (await store.get_task(queued)).status is TaskStatus.QUEUED


async def test_the_database_prunes_exactly_what_the_core_rule_names(lab: Lab, store: Store) -> None:
    await lab.host("h1", *(f"d{i}" for i in range(40)))
    rng = random.Random(20261202)
    tasks: dict[uuid.UUID, tuple[float, float]] = {}
    for i in range(40):
        if i % 4 == 0:
            task_id = await lab.submit(labels={"platform": "none"})  # queued: no device matches
        else:
            lease = await lab.running()
            outcome = rng.choice([Outcome.DONE, Outcome.FAILED, None])  # None: still running
            if outcome is not None:
                await store.report(lease, outcome, reason=outcome.value)
            task_id = lease.task_id
        created = rng.uniform(0, 120)
        tasks[task_id] = (created, rng.uniform(0, created))
        await age(store, task_id, created_days=created, updated_days=tasks[task_id][1])
    await mark_all_sent(store)
    async with store.engine.connect() as conn:
        now = (await conn.execute(text("SELECT now()"))).scalar_one()
        rows = (await conn.execute(text("SELECT task_id, status, created_at, updated_at FROM tasks"))).all()
    expected = {r.task_id for r in rows if prunable(TaskStatus(r.status), r.created_at, r.updated_at, now, KEEP)}
    assert 0 < len(expected) < len(tasks)

    assert await store.prune(KEEP, limit=7) == min(7, len(expected))  # a batch is bounded
    while await store.prune(KEEP, limit=7) == 7:
        pass

    async with store.engine.connect() as conn:
        left = set((await conn.execute(text("SELECT task_id FROM tasks"))).scalars().all())
    assert left == set(tasks) - expected


async def test_two_pruners_side_by_side_take_different_tasks(lab: Lab, store: Store) -> None:
    await lab.host("h1", "d1")
    ids = [await cancelled_while_running(lab) for _ in range(30)]
    await mark_all_sent(store)
    for task_id in ids:
        await age(store, task_id, created_days=45, updated_days=45)
    other = Store.connect(str(store.engine.url.render_as_string(hide_password=False)))
    try:
        pruned = await asyncio.gather(*(s.prune(KEEP, limit=3) for s in (store, other) for _ in range(5)))
    finally:
        await other.close()
    assert sum(pruned) == 30
    async with store.engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM tasks"))).scalar_one() == 0
        assert (await conn.execute(text("SELECT count(*) FROM attempts"))).scalar_one() == 0


async def test_a_retention_under_an_hour_is_refused_and_prunes_nothing(lab: Lab, store: Store) -> None:
    await lab.host("h1", "d1")
    task_id = await cancelled_while_running(lab)
    await age(store, task_id, created_days=1, updated_days=1)
    with pytest.raises(ValueError, match="shorter than the least allowed"):
        await store.prune(timedelta(minutes=59))
    with pytest.raises(ValueError, match=re.escape("outside 1..10000")):
        await store.prune(KEEP, limit=0)
    async with store.engine.begin() as conn:  # the database refuses it too, whoever calls it
        with pytest.raises(Exception, match="shorter than the least allowed"):
            await conn.execute(text("SELECT devsched_prune(interval '10 minutes', 10)"))
    assert (await store.get_task(task_id)).status is TaskStatus.CANCELLED
