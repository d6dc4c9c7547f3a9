"""Assignment inside a submit's and a report's own transaction (`Store(assign_inline=True)`), and what the
store tells its process after each commit (`on_commit`): the messages to publish, and whether a pass of the
assignment loop may still find work."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.store import Committed, DeviceSpec, NewTask
from devsched.store.placement.candidates import HEAD
from support.sql_log import logged, statements
from support.store_lab import PLAN, Lab, kinds, ref

pytestmark = pytest.mark.integration


async def test_a_submit_with_a_free_device_is_assigned_in_its_own_transaction(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    heard.clear()
    task_id = await lab.submit()
    (c,) = heard
    assert (c.operation, kinds(c), c.assignable) == ("submit", ["submitted", "assigned", "assignment"], False)
    assert [m.event.seq for m in c.messages if isinstance(m.event, TaskEvent)] == [1, 2]
    (assigned,) = [m.event for m in c.messages if isinstance(m.event, AttemptAssigned)]
    assert (assigned.task_id, assigned.device_id, assigned.attempt) == (task_id, "d1", 1)
    view = await lab.store.get_task(task_id)
    assert view.status is TaskStatus.ASSIGNED
    assert view.attempts[0].lease_id == assigned.lease_id
    assert await lab.store.assign() == [], "nothing left for the loop"


async def test_the_submit_and_its_assignment_are_one_transaction(inline: tuple[Lab, list[Committed]]) -> None:
    """BEGIN, the submit, the placement, COMMIT: through the driver, without SQLAlchemy or a read of the clock."""
    lab, heard = inline
    await lab.host("h1", "d1")
    with statements(lab.store) as sent:
        await lab.submit()
        await logged()
    assert len(sent) == 4, sent
    begin, submit, place, commit = sent
    assert (begin.upper().startswith("BEGIN"), commit.upper().startswith("COMMIT")) == (True, True), sent
    assert "INSERT INTO tasks" in submit
    assert "INSERT INTO attempts" in place
    assert kinds(heard[-1]) == ["submitted", "assigned", "assignment"]


async def test_a_submit_without_a_free_device_stays_queued_and_settled(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", platform="ios")
    heard.clear()
    task_id = await lab.submit(labels={"platform": "android"})
    (c,) = heard
    assert (kinds(c), c.assignable) == (["submitted"], False)
    assert (await lab.store.get_task(task_id)).status is TaskStatus.QUEUED


async def test_an_older_queued_task_takes_the_free_device_first(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    older = await lab.submit()  # no device yet
    await lab.host("h1", "d1")  # a registration assigns nothing itself: it asks for a pass
    assert heard[-1].operation == "register"
    assert heard[-1].assignable
    lab.clock.advance(1)
    heard.clear()
    newer = await lab.submit()
    (c,) = heard
    (assigned,) = [m.event for m in c.messages if isinstance(m.event, AttemptAssigned)]
    assert assigned.task_id == older
    assert c.assignable is False, "no other free device could take the new task"
    assert (await lab.store.get_task(newer)).status is TaskStatus.QUEUED


async def test_a_report_hands_its_device_to_the_next_task_by_priority_then_age(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    first = await lab.submit()
    (lease,) = [ref(m.event) for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
    assert lease.task_id == first
    low = await lab.submit(priority=-1)
    lab.clock.advance(1)
    high = await lab.submit(priority=5)
    await lab.submit(priority=100, labels={"platform": "ios"})  # first in line, but no device matches
    heard.clear()
    await lab.store.report(lease, Outcome.DONE)
    (c,) = heard
    assert (c.operation, kinds(c), c.assignable) == ("report", ["done", "assigned", "assignment"], False)
    (assigned,) = [m.event for m in c.messages if isinstance(m.event, AttemptAssigned)]
    assert (assigned.task_id, assigned.device_id) == (high, "d1")
    assert (await lab.store.get_task(low)).status is TaskStatus.QUEUED


async def test_a_report_with_nothing_queued_leaves_the_device_free(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = [ref(m.event) for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
    heard.clear()
    await lab.store.report(lease, Outcome.DONE)
    await lab.store.report(lease, Outcome.DONE)  # a repeat: nothing changes, nothing to say
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done"], False)
    assert (await lab.store.list_hosts())[0].devices[0].state.value == "available"


async def test_a_queue_longer_than_the_head_is_left_to_the_loop(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = [ref(m.event) for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
    async with lab.store.engine.begin() as conn:  # a head of tasks no device matches, ahead of the rest
        await conn.execute(
            text(
                """
                INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, selector_labels,
                                   created_at, updated_at, event_seq)
                SELECT gen_random_uuid(), 'queued', 10, 3, 30, '{"steps": []}', '{"platform": "ios"}',
                       now(), now(), 1
                FROM generate_series(1, :n)
                """
            ),
            {"n": HEAD},
        )
    waiting = await lab.submit()
    heard.clear()
    await lab.store.report(lease, Outcome.DONE)
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done"], True), "the head did not match: a pass must look further"
    assert [m.task_id for m in await lab.store.assign()] == [waiting]


async def test_a_device_another_transaction_holds_is_left_to_the_loop(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("SELECT 1 FROM devices WHERE device_id = 'd1' FOR UPDATE"))
        task_id = await lab.submit()
        await other.rollback()
    (c,) = heard
    assert (kinds(c), c.assignable) == (["submitted"], True)
    assert [m.task_id for m in await lab.store.assign()] == [task_id]


async def test_only_the_committed_try_of_a_retried_transaction_is_heard(inline: tuple[Lab, list[Committed]]) -> None:
    """Two submits with one idempotency key race: the loser's transaction runs again and finds the winner's."""
    lab, heard = inline
    await lab.host("h1", "d1", "d2")
    heard.clear()
    a, b = await asyncio.gather(
        lab.store.submit(NewTask(plan=PLAN, idempotency_key="k")),
        lab.store.submit(NewTask(plan=PLAN, idempotency_key="k")),
    )
    assert a.task_id == b.task_id
    assert sorted(c.operation for c in heard) == ["submit"], "the repeat wrote nothing and has nothing to say"
    (c,) = heard
    assert kinds(c) == ["submitted", "assigned", "assignment"]
    async with lab.store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT id FROM outbox ORDER BY id"))).scalars().all()
    assert [m.id for m in c.messages] == list(rows), "the ids heard are the rows committed"


async def test_without_assign_inline_only_the_loop_assigns(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1")
    task_id = await lab.submit()
    assert (kinds(heard[-1]), heard[-1].assignable) == (["submitted"], True)
    (m,) = await lab.store.assign()
    assert m.task_id == task_id
    assert heard[-1].operation == "assign"
    assert kinds(heard[-1]) == ["assigned", "assignment"]
    await lab.store.report(ref(m), Outcome.DONE)
    assert (kinds(heard[-1]), heard[-1].assignable) == (["done"], True), "a freed device asks for a pass"
    assert EventKind.DONE.value == "done"


async def test_the_loop_matches_narrow_and_wide_label_sets_and_pinned_tasks(lab: Lab) -> None:
    wide = {f"k{i}": f"v{i}" for i in range(7)}  # more labels than are looked up by their subsets
    await lab.store.register_host(
        "h1", [DeviceSpec("narrow", {"platform": "android", "model": "p7"}), DeviceSpec("wide", wide)]
    )
    on_narrow = await lab.submit(labels={"model": "p7"})
    on_wide = await lab.submit(labels={"k1": "v1", "k5": "v5", "k6": "v6"})
    nowhere = await lab.submit(labels={"k1": "v1", "model": "p7"})
    pinned_but_unmatched = await lab.submit(device_id="narrow", labels={"k1": "v1"})
    got = {m.task_id: m.device_id for m in await lab.store.assign()}
    assert got == {on_narrow: "narrow", on_wide: "wide"}
    for task_id in (nowhere, pinned_but_unmatched):
        assert (await lab.store.get_task(task_id)).status is TaskStatus.QUEUED
    a = (await lab.store.get_task(on_narrow)).attempts[-1]
    await lab.store.report(LeaseRef(a.host_id, on_narrow, a.attempt, a.lease_id), Outcome.DONE)
    pinned = await lab.submit(device_id="narrow", labels={"platform": "android"})
    assert [m.task_id for m in await lab.store.assign()] == [pinned]
