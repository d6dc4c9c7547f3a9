"""`list_tasks(id_prefix=...)` against a real Postgres: the tasks whose id starts with the prefix, and no other.

A prefix is matched as a range of UUIDs, so the tasks right outside it (the last id before, the first after)
are where a mistake would show.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from devsched.core.status import TaskStatus
from devsched.store import Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def _copy(store: Store, task_id: uuid.UUID, as_id: str) -> uuid.UUID:
    """A copy of the task's row under another id (ids are random: this is how two share a prefix)."""
    async with store.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO tasks SELECT (jsonb_populate_record(NULL::tasks, to_jsonb(t) || "
                "jsonb_build_object('task_id', CAST(:new AS text), 'idempotency_key', NULL))).* "
                "FROM tasks t WHERE task_id = :old"
            ),
            {"new": as_id, "old": task_id},
        )
    return uuid.UUID(as_id)


async def _listed(store: Store, prefix: str, **filters: object) -> set[uuid.UUID]:
    page = await store.list_tasks(id_prefix=prefix, limit=1000, **filters)  # type: ignore[arg-type]
    assert page.next is None
    return {t.task_id for t in page.tasks}


async def test_a_prefix_lists_exactly_the_tasks_whose_id_starts_with_it(lab: Lab) -> None:
    task = await lab.submit()
    same = await _copy(lab.store, task, "3af5939c-0000-4000-8000-000000000000")
    twin = await _copy(lab.store, task, "3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b")
    last = await _copy(lab.store, task, "3af5939c-ffff-ffff-ffff-ffffffffffff")
    before = await _copy(lab.store, task, "3af5939b-ffff-ffff-ffff-ffffffffffff")
    after = await _copy(lab.store, task, "3af5939d-0000-0000-0000-000000000000")

    assert await _listed(lab.store, "3af5939c") == {same, twin, last}
    assert await _listed(lab.store, "3af5939c-") == {same, twin, last}
    assert await _listed(lab.store, "3af5939c-1b") == {twin}
    assert await _listed(lab.store, "3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b") == {twin}
    assert await _listed(lab.store, "3af5939b") == {before}
    assert await _listed(lab.store, "3af5939d") == {after}
    assert await _listed(lab.store, "3af5939e") == set()
    assert await _listed(lab.store, str(task)[:8]) == {task}


async def test_a_prefix_combines_with_the_other_filters_and_pages(lab: Lab) -> None:
    task = await lab.submit()
    ids = [await _copy(lab.store, task, f"3af5939c-0000-4000-8000-{i:012x}") for i in range(3)]
    await lab.store.request_cancel(ids[0], "not needed")
    assert await _listed(lab.store, "3af5939c", status=TaskStatus.CANCELLED) == {ids[0]}
    assert await _listed(lab.store, "3af5939c", status=TaskStatus.QUEUED) == set(ids[1:])
    assert await _listed(lab.store, "3af5939c", device_id="d1") == set()  # none ran anywhere
    first = await lab.store.list_tasks(id_prefix="3af5939c", limit=2)
    assert first.next is not None
    rest = await lab.store.list_tasks(id_prefix="3af5939c", limit=2, after=first.next)
    assert {t.task_id for t in first.tasks + rest.tasks} == set(ids)
    assert rest.next is None
