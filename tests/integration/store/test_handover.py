"""A report hands the device it frees to the next queued task in one statement (`devsched.store.placement.handover`).

What it costs (four statements: BEGIN, the report, the hand-over, COMMIT), that it chooses as the loop's
matching does on generated queues (the same task, the same rows written), what it leaves to the loop (a
device or tasks another transaction holds), that a refused or repeated report hands nothing over, and
that concurrent reports, releases and loop passes assign each task's attempt exactly once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import LeaseExpired, LeaseForeign
from devsched.core.events import AttemptAssigned
from devsched.core.matching import matches
from devsched.core.records import DeviceRecord, LeaseRef, Selector
from devsched.core.status import Outcome, TaskStatus
from devsched.store import Committed, DeviceSpec, ManualClock, Store
from devsched.store.driver import in_transaction
from devsched.store.outbox import Outbox
from devsched.store.placement import assignment, handover
from devsched.store.views import OutboxMessage
from support.polling import eventually
from support.queue_cases import NOW, VALUES, Queued
from support.sql_log import logged, statements
from support.store_lab import Lab, kinds, ref

pytestmark = pytest.mark.integration


def leases(c: Committed) -> list[LeaseRef]:
    return [ref(m.event) for m in c.messages if isinstance(m.event, AttemptAssigned)]


# -- cost ---------------------------------------------------------------------------------------------------


async def test_a_report_and_its_hand_over_are_four_statements(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    waiting = await lab.submit()
    heard.clear()
    with statements(lab.store) as sent:
        await lab.store.report(lease, Outcome.DONE)
        await logged()
    assert len(sent) == 4, sent
    begin, report, hand_over, commit = sent
    assert begin.upper().startswith("BEGIN"), sent
    assert commit.upper().startswith("COMMIT"), sent
    assert "UPDATE attempts" in report
    assert "INSERT INTO attempts" in hand_over
    (c,) = heard
    assert (c.operation, kinds(c), c.assignable) == ("report", ["done", "assigned", "assignment"], False)
    assert [m.id for m in c.messages] == sorted(m.id for m in c.messages)
    (assigned,) = leases(c)
    assert (assigned.task_id, assigned.attempt) == (waiting, 1)
    view = await lab.store.get_task(waiting)
    assert view.status is TaskStatus.ASSIGNED
    assert (view.attempts[0].device_id, view.attempts[0].lease_id) == ("d1", assigned.lease_id)


async def test_a_report_whose_device_matches_nothing_queued_leaves_it_free(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", platform="android")
    await lab.submit(labels={"platform": "android"})
    (lease,) = leases(heard[-1])
    others = [await lab.submit(labels={"platform": "ios"}), await lab.submit(device_id="d2")]
    heard.clear()
    with statements(lab.store) as sent:
        await lab.store.report(lease, Outcome.FAILED, reason="boom")
        await logged()
    assert len(sent) == 4, sent
    (c,) = heard
    assert (kinds(c), c.assignable) == (["failed"], False), "the whole queue was looked at: nothing for a pass"
    for task_id in others:
        assert (await lab.store.get_task(task_id)).status is TaskStatus.QUEUED
    assert (await lab.store.list_hosts())[0].devices[0].state.value == "available"
    assert await lab.store.assign() == []


# -- what it chooses ----------------------------------------------------------------------------------------


async def test_a_pinned_task_takes_its_device_before_older_and_lower_ones(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", "d2")
    await lab.submit()
    await lab.submit()
    lease, other = [lease for c in heard for lease in leases(c)]
    freed = (await lab.store.get_task(lease.task_id)).attempts[0].device_id
    busy = (await lab.store.get_task(other.task_id)).attempts[0].device_id
    unpinned = await lab.submit(priority=1)
    lab.clock.advance(1)
    elsewhere = await lab.submit(priority=5, device_id=busy)
    mine = await lab.submit(priority=5, device_id=freed)
    heard.clear()
    await lab.store.report(lease, Outcome.DONE)
    (c,) = heard
    assert [m.task_id for m in leases(c)] == [mine]
    for task_id in (unpinned, elsewhere):
        assert (await lab.store.get_task(task_id)).status is TaskStatus.QUEUED


async def test_a_task_another_transaction_holds_is_passed_over_for_the_next(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    held = await lab.submit()
    lab.clock.advance(1)
    following = await lab.submit()
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("SELECT 1 FROM tasks WHERE task_id = :id FOR UPDATE"), {"id": held})
        await lab.store.report(lease, Outcome.DONE)
        await other.rollback()
    (c,) = heard
    assert [m.task_id for m in leases(c)] == [following]
    assert (await lab.store.get_task(held)).status is TaskStatus.QUEUED


async def test_a_device_another_transaction_holds_is_left_to_the_loop(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    waiting = await lab.submit()
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("SELECT 1 FROM devices WHERE device_id = 'd1' FOR UPDATE"))
        await lab.store.report(lease, Outcome.DONE)
        await other.rollback()
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done"], True), "a pass must give the device its work"
    assert [m.task_id for m in await lab.store.assign()] == [waiting]


async def test_a_drained_device_is_not_handed_over(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    waiting = await lab.submit()
    await lab.store.drain_device("d1", True, "repair")
    heard.clear()
    await lab.store.report(lease, Outcome.DONE)
    (c,) = heard
    assert (kinds(c), c.assignable) == (["done"], False)
    assert (await lab.store.get_task(waiting)).status is TaskStatus.QUEUED


# -- refused and repeated reports -----------------------------------------------------------------------------


async def test_refused_and_repeated_reports_hand_nothing_over(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.host("h2", "e1")
    await lab.submit()
    await lab.submit()
    first, second = [lease for c in heard for lease in leases(c)]
    waiting = await lab.submit()
    heard.clear()
    with pytest.raises(LeaseForeign):
        await lab.store.report(LeaseRef("h2", first.task_id, first.attempt, first.lease_id), Outcome.DONE)
    lab.clock.advance(31)  # past the ttl of both leases (30 s); the hosts stay alive
    await lab.alive()
    with pytest.raises(LeaseExpired):
        await lab.store.report(second, Outcome.DONE)
    assert [c.operation for c in heard] == [], "a refused report commits nothing to say"
    assert (await lab.store.get_task(waiting)).status is TaskStatus.QUEUED
    async with lab.store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT count(*) FROM attempts"))).scalar_one()
    assert rows == 2

    lab.clock.advance(-31)  # a live lease again: the report is granted, then repeated
    await lab.store.report(first, Outcome.DONE)
    (c,) = heard
    assert [m.task_id for m in leases(c)] == [waiting]
    heard.clear()
    receipt = await lab.store.report(first, Outcome.DONE)
    assert receipt.duplicate
    assert heard == [], "a repeat changes nothing and hands nothing over"


async def test_a_report_the_grant_misses_hands_over_after_the_locked_path(
    inline: tuple[Lab, list[Committed]], database_url: str
) -> None:
    """The task row changes while the grant waits for it: the locked path records the report, then hands over."""
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.submit()
    (lease,) = leases(heard[-1])
    waiting = await lab.submit()
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("UPDATE tasks SET updated_at = updated_at WHERE task_id = :id"), {"id": lease.task_id})
        report = asyncio.ensure_future(lab.store.report(lease, Outcome.DONE))

        async def waiting_for_the_row() -> bool:
            async with lab.store.engine.connect() as conn:
                found = await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                )
                return bool(found.scalar_one())

        await eventually(waiting_for_the_row, timeout=10, message="the report waits for the task row")
        await other.commit()
        await asyncio.wait_for(report, timeout=10)
    (c,) = heard
    assert (c.operation, kinds(c), c.assignable) == ("report", ["done", "assigned", "assignment"], False)
    assert [m.id for m in c.messages] == sorted(m.id for m in c.messages)
    assert [m.task_id for m in leases(c)] == [waiting]


# -- the same choice as the loop's --------------------------------------------------------------------------

FLAGS = tuple(f"k{i}" for i in range(6))  # with both of the above, up to 8 labels: wider than the loop's subsets


@dataclass(frozen=True)
class Case:
    device: str  # "free", "drained", "grace", "offline", "unregistered"
    labels: Mapping[str, str]
    queue: tuple[Queued, ...]


def _labels(draw: st.DrawFn, *, max_flags: int) -> dict[str, str]:
    labels = {k: draw(st.sampled_from(v)) for k, v in VALUES.items() if draw(st.booleans())}
    return labels | {k: "v" for k in draw(st.lists(st.sampled_from(FLAGS), max_size=max_flags, unique=True))}


@st.composite
def queued(draw: st.DrawFn) -> Queued:
    return Queued(
        priority=draw(st.sampled_from([0, 0, 1, -1])),
        age_s=draw(st.integers(0, 2)),  # ties: the task id decides
        labels=_labels(draw, max_flags=2),
        device_id=draw(st.sampled_from([None, None, None, "d1", "d2"])),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    device = draw(st.sampled_from(["free"] * 6 + ["drained", "grace", "offline", "unregistered"]))
    return Case(device, _labels(draw, max_flags=6), tuple(draw(st.lists(queued(), max_size=6))))


_DEVICE_STATE = {
    "free": "SELECT 1",
    "drained": "UPDATE devices SET drained = true WHERE device_id = 'd1'",
    "grace": f"UPDATE devices SET available_after = '{NOW + timedelta(seconds=5)}' WHERE device_id = 'd1'",
    "offline": f"UPDATE hosts SET last_seen_at = '{NOW - timedelta(hours=1)}' WHERE host_id = 'h1'",
    "unregistered": "UPDATE devices SET registered = false WHERE device_id = 'd1'",
}


async def _seed(conn: AsyncConnection, case: Case, ended: uuid.UUID, queued: list[tuple[uuid.UUID, Queued]]) -> None:
    """d1 (on h1) just freed by attempt 1 of `ended`, in the state `case` says; d2 (on h2) drained; the queue."""
    labels = {"labels": json.dumps(dict(case.labels))}
    await conn.execute(text("UPDATE devices SET labels = CAST(:labels AS jsonb) WHERE device_id = 'd1'"), labels)
    await conn.execute(text(_DEVICE_STATE[case.device]))
    await conn.execute(text("UPDATE devices SET drained = true WHERE device_id = 'd2'"))
    await conn.execute(
        text(
            "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at, updated_at,"
            " attempt_count, event_seq) VALUES (:id, 'done', 0, 3, 30, '{}', :t, :t, 1, 4)"
        ),
        {"id": ended, "t": NOW - timedelta(minutes=5)},
    )
    await conn.execute(
        text(
            "INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at,"
            " ended_at, end_reason) VALUES (:id, 1, :lease, 'h1', 'd1', 'done', :t, :t, :t, 'done')"
        ),
        {"id": ended, "lease": uuid.uuid4(), "t": NOW - timedelta(seconds=1)},
    )
    for task_id, q in queued:
        await conn.execute(
            text(
                "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, selector_labels,"
                " selector_device_id, created_at, updated_at, event_seq, trace_headers)"
                " VALUES (:id, 'queued', :priority, 3, :ttl, CAST(:plan AS jsonb), CAST(:labels AS jsonb), :device,"
                " :t, :t, 1, CAST(:trace AS jsonb))"
            ),
            {"id": task_id, "priority": q.priority, "ttl": 10 + q.age_s, "plan": json.dumps({"n": str(task_id)}),
             "labels": json.dumps(dict(q.labels)), "device": q.device_id, "t": NOW - timedelta(seconds=q.age_s),
             "trace": json.dumps({"traceparent": f"00-{task_id.hex}-0000000000000001-01"} if q.age_s else {})},
        )  # fmt: skip


async def _tables(conn: AsyncConnection) -> Mapping[str, list[str]]:
    """The rows an assignment writes, lease ids and outbox ids aside (each path draws its own)."""
    queries = {
        "tasks": "SELECT to_jsonb(x) FROM tasks x",
        "attempts": "SELECT to_jsonb(x) - 'lease_id' FROM attempts x",
        "reservations": "SELECT to_jsonb(x) FROM reservations x",
        "outbox": "SELECT to_jsonb(x) - 'id' - 'xid' #- '{data,lease_id}' FROM outbox x",
    }
    out = {}
    for table, query in queries.items():
        rows = (await conn.execute(text(query))).scalars().all()
        out[table] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return out


async def _by_the_loop(conn: AsyncConnection, clock: ManualClock, ended: uuid.UUID) -> assignment.Outcome:
    return await assignment.assign(conn, NOW, Outbox(), limit=200, device_limit=2000, clock=clock)


async def _handed_over(conn: AsyncConnection, clock: ManualClock, ended: uuid.UUID) -> assignment.Outcome:
    written: list[OutboxMessage] = []
    placed, _ = await handover.hand_over(await in_transaction(conn), clock, ended, 1, written)
    return placed


class Agreement:
    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store, self.clock = store, clock

    async def both(self, case: Case) -> tuple[list[Any], list[tuple[uuid.UUID, Queued]]]:
        ended = uuid.uuid4()
        queued = [(uuid.uuid4(), q) for q in case.queue]
        answers: list[Any] = []
        for path in (_by_the_loop, _handed_over):
            async with self.store.engine.connect() as conn:
                tx = await conn.begin()
                await _seed(conn, case, ended, queued)
                done = await path(conn, self.clock, ended)
                answers.append(([m.task_id for m in done.assigned], done.settled, await _tables(conn)))
                await tx.rollback()
        return answers, queued


@pytest.fixture
def agreement(database_url: str) -> Any:
    loop = asyncio.new_event_loop()
    clock = ManualClock(NOW)
    store = Store.connect(database_url, clock=clock, pool_size=1, max_overflow=0)
    loop.run_until_complete(store.register_host("h1", [DeviceSpec("d1")]))
    loop.run_until_complete(store.register_host("h2", [DeviceSpec("d2")]))
    try:
        yield loop, Agreement(store, clock)
    finally:
        loop.run_until_complete(store.close())
        loop.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_hand_over_chooses_and_writes_as_the_loop_does(agreement: Any, case: Case) -> None:
    loop, check = agreement
    answers, queued = loop.run_until_complete(check.both(case))
    (by_loop, _, loop_rows), (handed, settled, handed_rows) = answers
    device = DeviceRecord("d1", "h1", case.labels)
    ordered = sorted(queued, key=lambda q: (-q[1].priority, -q[1].age_s, q[0]))
    expected = [t for t, q in ordered if matches(Selector(q.labels, q.device_id), device)][:1]
    if case.device != "free":
        expected = []
    event(f"device {case.device}: {'assigned' if expected else 'nothing'}")
    assert handed == by_loop == expected
    assert settled, "alone, the hand-over is conclusive"
    assert handed_rows == loop_rows


# -- concurrency --------------------------------------------------------------------------------------------


async def _active(store: Store) -> list[LeaseRef]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT host_id, task_id, attempt, lease_id FROM attempts WHERE status = 'active' ORDER BY task_id")
        )
        return [LeaseRef(r.host_id, r.task_id, r.attempt, r.lease_id) for r in rows]


async def test_concurrent_reports_releases_and_passes_assign_each_attempt_once(
    database_url: str, clock: ManualClock
) -> None:
    store = Store.connect(database_url, clock=clock, assign_inline=True, pool_size=12, max_overflow=4)
    heard: list[Committed] = []
    store.on_commit = heard.append
    lab = Lab(store, clock)
    try:
        await lab.host("h1", *[f"a{i}" for i in range(5)])
        await lab.host("h2", *[f"b{i}" for i in range(5)])
        tasks = [await lab.submit(priority=i % 3) for i in range(50)]
        for round_ in range(40):
            current = await _active(store)
            if not current:
                break
            start = len(heard)
            calls = [
                store.release(lease) if round_ < 3 and n % 3 == 0 else store.report(lease, Outcome.DONE)
                for n, lease in enumerate(current)
            ]
            # every request races the others for the head of the queue, and two loop passes race them all
            answers = await asyncio.gather(*calls, store.assign(), store.assign())
            assert all(not getattr(a, "duplicate", False) for a in answers[: len(current)])
            if any(c.assignable for c in heard[start:]):  # what the scheduler does: a pass when one is asked for
                while await store.assign():
                    pass
            async with store.engine.connect() as conn:
                idle = await conn.execute(
                    text(
                        "SELECT count(*) FROM devices d WHERE NOT EXISTS (SELECT 1 FROM reservations r"
                        " WHERE r.device_id = d.device_id AND r.attempt_status = 'active')"
                    )
                )
                queued = await conn.execute(text("SELECT count(*) FROM tasks WHERE status = 'queued'"))
                assert not (idle.scalar_one() and queued.scalar_one()), "a device idles while work waits"
        else:
            raise AssertionError("the queue did not drain")
        assigned = [m.event for c in heard for m in c.messages if isinstance(m.event, AttemptAssigned)]
        keys = [(a.task_id, a.attempt) for a in assigned]
        assert len(keys) == len(set(keys)), "an attempt was assigned twice"
        async with store.engine.connect() as conn:
            rows = (await conn.execute(text("SELECT task_id, attempt, status, device_id FROM attempts"))).all()
            statuses = dict((await conn.execute(text("SELECT task_id, status FROM tasks"))).all())
        assert sorted((r.task_id, r.attempt) for r in rows) == sorted(keys)
        assert {statuses[t] for t in tasks} == {"done"}
        for task_id in tasks:
            mine = sorted((r.attempt, r.status) for r in rows if r.task_id == task_id)
            assert [s for _, s in mine] == ["released"] * (len(mine) - 1) + ["done"], mine
        assert any(c.operation == "report" and leases(c) for c in heard), "reports handed devices over"
    finally:
        await store.close()
