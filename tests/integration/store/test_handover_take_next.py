"""A report that asks for it (`take_next`) hands the device's next attempt to its host already dispatched.

The hand-over then writes what the assignment and the host's claim with the first step's progress would
have written (the task dispatched, the attempt dispatched with that progress, the `assigned`,
`dispatched` and `progress` events numbered consecutively) and no assignment message; a duplicate report
hands the same attempt again while it is still to run; a device that may take no work hands nothing; a
report without the field hands over exactly as before; and concurrent reports (with a sweeper and loop
passes) still assign each attempt once.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskStatus
from devsched.store import Committed, ManualClock, Store
from devsched.store.views import Handed
from support.store_lab import PLAN, Lab, kinds, ref

pytestmark = pytest.mark.integration


def leases(c: Committed) -> list[LeaseRef]:
    return [ref(m.event) for m in c.messages if isinstance(m.event, AttemptAssigned)]


def lease_of(host_id: str, handed: Handed) -> LeaseRef:
    return LeaseRef(host_id, handed.task_id, handed.attempt, handed.lease_id)


async def _first(lab: Lab, heard: list[Committed]) -> tuple[LeaseRef, uuid.UUID]:
    """h1 with d1 running a first task (assigned by its submit), and a second one queued."""
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    await lab.store.claim(lease)
    waiting = await lab.submit()
    heard.clear()
    return lease, waiting


async def test_the_next_attempt_is_handed_over_dispatched_without_an_assignment_message(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    lease, waiting = await _first(lab, heard)
    receipt = await lab.store.report(lease, Outcome.DONE, take_next=True)
    handed = receipt.next
    assert handed is not None
    assert (handed.task_id, handed.attempt, handed.device_id) == (waiting, 1, "d1")
    assert (handed.ttl_s, handed.cancel_requested, handed.stop) == (30, False, None)
    assert handed.plan == PLAN
    (c,) = heard
    assert (c.operation, kinds(c), c.assignable) == ("report", ["done", "assigned", "dispatched", "progress"], False)
    events = [m.event for m in c.messages if isinstance(m.event, TaskEvent) and m.event.task_id == waiting]
    assert [e.seq for e in events] == [1 + 1, 1 + 2, 1 + 3], "consecutive, after the task's `submitted`"
    assert [e.status for e in events] == [TaskStatus.ASSIGNED, TaskStatus.DISPATCHED, TaskStatus.DISPATCHED]
    assert {(e.attempt, e.host_id, e.device_id) for e in events} == {(1, "h1", "d1")}
    progress = events[-1].progress
    steps = PLAN["steps"]
    assert progress is not None
    assert (progress.step, progress.index, progress.of) == (steps[0]["name"], 0, len(steps))
    view = await lab.store.get_task(waiting)
    assert view.status is TaskStatus.DISPATCHED
    (attempt,) = view.attempts
    assert (attempt.lease_id, attempt.device_id, attempt.expires_at) == (handed.lease_id, "d1", handed.expires_at)
    async with lab.store.engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT assigned_at, dispatched_at, progress FROM attempts WHERE task_id = :id"), {"id": waiting}
            )
        ).one()
        seq = (await conn.execute(text("SELECT event_seq FROM tasks WHERE task_id = :id"), {"id": waiting})).scalar()
        assignments = (await conn.execute(text("SELECT count(*) FROM outbox WHERE kind = 'assignment'"))).scalar()
    assert row.dispatched_at == row.assigned_at
    assert row.progress == {"step": steps[0]["name"], "index": 0, "of": len(steps)}
    assert seq == 4
    assert assignments == 1, "only the first task's assignment (by its submit): none for the one handed over"

    # it runs as a claimed attempt: renewed, its first boundary's progress unchanged (no event), then reported
    heard.clear()
    mine = lease_of("h1", handed)
    await lab.store.renew(mine, {"step": steps[0]["name"], "index": 0, "of": len(steps)})
    assert heard == [], "the hand-over's progress was the first boundary's"
    again = await lab.store.claim(mine)  # a claim of it (an agent that did not know) is a renewal
    assert not again.dispatch
    done = await lab.store.report(mine, Outcome.DONE, take_next=True)
    assert (done.status, done.next) == (TaskStatus.DONE, None)


async def test_a_report_without_take_next_hands_over_as_before(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    lease, waiting = await _first(lab, heard)
    receipt = await lab.store.report(lease, Outcome.DONE)
    assert receipt.next is None
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done", "assigned", "assignment"], False)
    assert (await lab.store.get_task(waiting)).status is TaskStatus.ASSIGNED


async def test_a_duplicate_report_hands_the_same_attempt_again_while_it_is_to_run(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    lease, _ = await _first(lab, heard)
    first = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert first.next is not None
    heard.clear()
    repeat = await lab.store.report(lease, Outcome.DONE, take_next=True)  # the first reply was lost
    assert repeat.duplicate
    assert repeat.recorded_at == first.recorded_at
    assert repeat.next == first.next
    assert heard == [], "a repeat writes nothing"
    # the same without asking: the answer a report without the field always got
    assert (await lab.store.report(lease, Outcome.DONE)).next is None
    # once the handed attempt ended, a repeat hands nothing (nor the attempt after it)
    third = await lab.submit()
    lab.clock.advance(1)
    mine = lease_of("h1", first.next)
    ended = await lab.store.report(mine, Outcome.DONE, take_next=True)
    assert ended.next is not None
    assert ended.next.task_id == third
    late = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert late.duplicate
    assert late.next is None


async def test_a_duplicate_hands_what_is_left_of_the_lease_and_nothing_once_it_ran_out(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    lease, _ = await _first(lab, heard)
    first = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert first.next is not None
    lab.clock.advance(10)
    await lab.alive()
    later = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert later.next is not None
    assert (later.next.lease_id, later.next.expires_at) == (first.next.lease_id, first.next.expires_at)
    assert later.next.ttl_s == 20, "what is left of the lease: the host's clock counts from this answer"
    lab.clock.advance(21)
    await lab.alive()
    assert (await lab.store.report(lease, Outcome.DONE, take_next=True)).next is None


@pytest.mark.parametrize("state", ["drained", "quarantined", "cancelled"])
async def test_a_device_that_may_take_no_work_or_a_cancelled_task_hands_nothing(
    inline: tuple[Lab, list[Committed]], state: str
) -> None:
    lab, heard = inline
    lease, waiting = await _first(lab, heard)
    if state == "drained":
        await lab.store.drain_device("d1", True, "repair")
    elif state == "quarantined":
        async with lab.store.engine.begin() as conn:
            await conn.execute(text("UPDATE devices SET quarantined_at = now() WHERE device_id = 'd1'"))
    else:
        await lab.store.request_cancel(waiting, "not wanted")  # a queued task is cancelled at once
    heard.clear()
    receipt = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert receipt.next is None
    (c,) = heard
    assert kinds(c) == ["done"]
    expected = TaskStatus.CANCELLED if state == "cancelled" else TaskStatus.QUEUED
    assert (await lab.store.get_task(waiting)).status is expected


async def test_a_store_that_does_not_assign_inline_hands_nothing(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    waiting = await lab.submit()
    assert (await lab.store.report(lease, Outcome.DONE, take_next=True)).next is None
    assert (await lab.store.get_task(waiting)).status is TaskStatus.QUEUED


async def test_concurrent_reports_taking_next_sweeps_and_passes_run_each_attempt_once(
    database_url: str, clock: ManualClock
) -> None:
    """Real concurrent sessions: every host's report takes the next attempt while loop passes and a sweep race."""
    store = Store.connect(database_url, clock=clock, assign_inline=True, pool_size=12, max_overflow=4)
    heard: list[Committed] = []
    store.on_commit = heard.append
    lab = Lab(store, clock)
    try:
        await lab.host("h1", *[f"a{i}" for i in range(4)])
        await lab.host("h2", *[f"b{i}" for i in range(4)])
        tasks = [await lab.submit(priority=i % 3) for i in range(40)]
        running: list[LeaseRef] = []
        async with store.engine.connect() as conn:
            rows = await conn.execute(text("SELECT host_id, task_id, attempt, lease_id FROM attempts"))
            running = [LeaseRef(r.host_id, r.task_id, r.attempt, r.lease_id) for r in rows]
        for lease in running:
            await store.claim(lease)
        handed_keys: list[tuple[uuid.UUID, int]] = []
        for _ in range(60):
            if not running:
                break
            answers = await asyncio.gather(
                *(store.report(lease, Outcome.DONE, take_next=True) for lease in running),
                store.assign(),
                store.sweep_expired(),
            )
            reports = answers[: len(running)]
            active = await _rows(store, "SELECT task_id, attempt, host_id FROM attempts WHERE status = 'active'")
            hosts = {(r.task_id, r.attempt): r.host_id for r in active}
            running = []
            for answer in reports:
                assert not answer.duplicate
                if answer.next is not None:
                    handed_keys.append((answer.next.task_id, answer.next.attempt))
                    running.append(lease_of(hosts[(answer.next.task_id, answer.next.attempt)], answer.next))
            # what the loop assigned (the sweep and passes) is claimed as an agent would
            for r in await _rows(
                store,
                "SELECT host_id, task_id, attempt, lease_id FROM attempts WHERE status = 'active'"
                " AND dispatched_at IS NULL",
            ):
                lease = LeaseRef(r.host_id, r.task_id, r.attempt, r.lease_id)
                await store.claim(lease)
                running.append(lease)
            while not running and await store.assign():
                pass
            if not running:
                for r in await _rows(
                    store,
                    "SELECT host_id, task_id, attempt, lease_id FROM attempts WHERE status = 'active'",
                ):
                    lease = LeaseRef(r.host_id, r.task_id, r.attempt, r.lease_id)
                    await store.claim(lease)
                    running.append(lease)
        else:
            raise AssertionError("the queue did not drain")
        assert handed_keys, "reports handed attempts over"
        assert len(handed_keys) == len(set(handed_keys))
        rows = await _rows(store, "SELECT task_id, attempt, status FROM attempts")
        statuses = dict((r.task_id, r.status) for r in await _rows(store, "SELECT task_id, status FROM tasks"))
        assert {statuses[t] for t in tasks} == {"done"}
        assert sorted((r.task_id, r.attempt) for r in rows) == sorted({(r.task_id, r.attempt) for r in rows})
        assert all(r.status == "done" for r in rows), "nothing expired: one attempt each"
        new_attempts = [m.event for c in heard for m in c.messages if isinstance(m.event, TaskEvent)]
        assigned = [(e.task_id, e.attempt) for e in new_attempts if e.event.value == "assigned"]
        assert len(assigned) == len(set(assigned)) == len(rows)
        messages = [(m.task_id, m.attempt) for c in heard for m in (x.event for x in c.messages)
                    if isinstance(m, AttemptAssigned)]  # fmt: skip
        assert not set(messages) & set(handed_keys), "no assignment message for an attempt handed over"
    finally:
        await store.close()


async def _rows(store: Store, query: str) -> list:  # type: ignore[type-arg]
    async with store.engine.connect() as conn:
        return list((await conn.execute(text(query))).all())


async def test_the_resync_never_publishes_an_attempt_handed_over_again(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", "d2")
    await lab.submit()
    await lab.submit()
    first, other = [lease for c in heard for lease in leases(c)]
    await lab.store.claim(first)  # `other` stays assigned, unclaimed: the resync's
    waiting = await lab.submit()
    receipt = await lab.store.report(first, Outcome.DONE, take_next=True)
    assert receipt.next is not None
    assert receipt.next.task_id == waiting
    again = await lab.store.unclaimed_assignments()
    assert [(u.assignment.task_id, u.assignment.attempt) for u in again] == [(other.task_id, other.attempt)]


async def test_a_device_now_another_host_s_is_not_handed_to_the_reporting_host(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    lease, waiting = await _first(lab, heard)
    await lab.host("h2", "e1")
    async with lab.store.engine.begin() as conn:
        # As if an operator freed it (`devices.forget`) and h2 registered it: a device's host changes no other way.
        await conn.execute(text("UPDATE devices SET freed_at = now() WHERE device_id = 'd1'"))
        await conn.execute(text("UPDATE devices SET host_id = 'h2', freed_at = NULL WHERE device_id = 'd1'"))
    heard.clear()
    receipt = await lab.store.report(lease, Outcome.DONE, take_next=True)
    assert receipt.next is None
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done"], True), "left to the loop"
    assert [m.host_id for m in await lab.store.assign() if m.task_id == waiting] == ["h2"]
