"""A submit places its task in one statement after its own (`devsched.store.placement.submitted`).

What it costs (BEGIN, the submit, the placement, COMMIT; a repeated key: no placement; a selector that
found no free device last time: the submit alone, counting them, and the placement in a transaction of its
own only when it finds some, with the same outcome as in one transaction), that it chooses
as core's greedy plan over the head of the queue and the free devices the new task could use does, and
writes what the loop writes for the same pair, what it leaves to the loop (held rows, a task ahead that
took one of several devices), and that many concurrent submits assign each task at most once and never
book a device twice.
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

from devsched.core.events import AttemptAssigned
from devsched.core.matching import plan_assignments
from devsched.core.records import DeviceRecord, QueuedTask, Selector
from devsched.core.status import TaskStatus
from devsched.store import Committed, DeviceSpec, ManualClock, NewTask, Store, tasks
from devsched.store.driver import in_transaction
from devsched.store.outbox import Outbox
from devsched.store.placement import assignment, candidates
from devsched.store.placement import submitted as placement
from devsched.store.views import OutboxMessage
from support.queue_cases import NOW, VALUES, Queued
from support.sql_log import logged, statements
from support.store_lab import PLAN, Lab, kinds

pytestmark = pytest.mark.integration


def placed(c: Committed) -> list[tuple[uuid.UUID, str]]:
    return [(m.event.task_id, m.event.device_id) for m in c.messages if isinstance(m.event, AttemptAssigned)]


# -- cost -------------------------------------------------------------------------------------------------


async def test_a_submit_without_a_free_device_is_four_statements_then_one(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", platform="ios")
    heard.clear()
    with statements(lab.store) as sent:
        first = await lab.submit(labels={"platform": "android"})
        await logged()
    assert len(sent) == 4, sent
    (c,) = heard
    assert (kinds(c), c.assignable) == (["submitted"], False)
    heard.clear()
    with statements(lab.store) as sent:
        second = await lab.submit(labels={"platform": "android"})  # its selector found nothing free last time
        await logged()
    assert len(sent) == 1, sent  # the submit, counting the free devices itself: none, so no placement
    (c,) = heard
    assert (kinds(c), c.assignable) == (["submitted"], False)
    for task_id in (first, second):
        assert (await lab.store.get_task(task_id)).status is TaskStatus.QUEUED
    with statements(lab.store) as sent:
        await lab.submit(labels={"platform": "ios"})  # another selector: looked at on its own
        await logged()
    assert len(sent) == 4, sent


async def test_a_selector_that_finds_a_device_after_all_places_in_a_transaction_of_its_own(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    await lab.store.drain_device("d1", True, "held")
    first = await lab.submit()  # nothing free: the selector is remembered
    await lab.store.drain_device("d1", False)  # free again; no pass runs here
    lab.clock.advance(1)
    heard.clear()
    with statements(lab.store) as sent:
        second = await lab.submit()
        await logged()
    assert len(sent) == 2, sent  # the counting submit (one free device), then the placement on its own
    (c,) = heard
    assert "submitted" in kinds(c)
    assert (placed(c), c.assignable) == ([(first, "d1")], False), "the task ahead first, as in one transaction"
    assert (await lab.store.get_task(second)).status is TaskStatus.QUEUED
    with statements(lab.store) as sent:
        await lab.submit()  # forgotten: it found a device
        await logged()
    assert len(sent) == 4, sent


async def test_a_repeated_key_returns_the_first_task_and_places_nothing(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    first = await lab.store.submit(NewTask(plan=PLAN, idempotency_key="k"))  # no device yet: queued
    await lab.host("h1", "d1")
    heard.clear()
    with statements(lab.store) as sent:
        again = await lab.store.submit(NewTask(plan=PLAN, idempotency_key="k"))
        await logged()
    assert (again.task_id, again.created) == (first.task_id, False)
    assert len(sent) == 1, sent  # the counting submit: the first of its selector found nothing free
    assert heard == [], "a repeat writes nothing and asks for nothing"
    assert (await lab.store.get_task(first.task_id)).status is TaskStatus.QUEUED, "the loop's, not the repeat's"


async def test_without_assign_inline_a_submit_is_one_statement(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1")
    with statements(lab.store) as sent:
        await lab.submit()
        await logged()
    assert len(sent) == 1, sent
    assert (kinds(heard[-1]), heard[-1].assignable) == (["submitted"], True)


# -- what it leaves to the loop ------------------------------------------------------------------------------


async def test_a_task_ahead_takes_one_of_two_devices_and_the_loop_places_the_new_one(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    older = await lab.submit()  # no device yet
    await lab.host("h1", "d1", "d2")  # a registration asks for a pass; none runs here
    lab.clock.advance(1)
    heard.clear()
    newer = await lab.submit()
    (c,) = heard
    assert placed(c) == [(older, "d1")]
    assert c.assignable, "d2 is free and the new task could take it"
    assert [(m.task_id, m.device_id) for m in await lab.store.assign()] == [(newer, "d2")]


async def test_a_task_another_transaction_holds_is_passed_over(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    held = await lab.submit()
    await lab.host("h1", "d1")
    lab.clock.advance(1)
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("SELECT 1 FROM tasks WHERE task_id = :id FOR UPDATE"), {"id": held})
        newer = await lab.submit()
        await other.rollback()
    (c,) = heard
    assert (placed(c), c.assignable) == ([(newer, "d1")], False), "the holder answers for the task it holds"
    assert (await lab.store.get_task(held)).status is TaskStatus.QUEUED


async def test_a_device_another_transaction_holds_is_passed_over_for_the_next(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1", "d2")
    heard.clear()
    async with lab.store.engine.connect() as other:
        await other.execute(text("SELECT 1 FROM devices WHERE device_id = 'd1' FOR UPDATE"))
        task_id = await lab.submit()
        await other.rollback()
    (c,) = heard
    assert (placed(c), c.assignable) == ([(task_id, "d2")], False)


# -- the same choice as the loop's ---------------------------------------------------------------------------

DEVICES = ("d1", "d2", "d3")


@dataclass(frozen=True)
class Device:
    state: str  # "free", "busy", "drained", "grace", "offline"
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Case:
    devices: tuple[Device, ...]  # d1, d2, d3 (each on its own host), in the loop's order
    queue: tuple[Queued, ...]
    new: Queued  # age 0: the newest of its priority


def _labels(draw: st.DrawFn) -> dict[str, str]:
    return {k: draw(st.sampled_from(v)) for k, v in VALUES.items() if draw(st.booleans())}


@st.composite
def queued(draw: st.DrawFn, *, age: st.SearchStrategy[int]) -> Queued:
    return Queued(
        priority=draw(st.sampled_from([0, 0, 1, -1])),
        age_s=draw(age),
        labels=_labels(draw),
        device_id=draw(st.sampled_from([None, None, None, *DEVICES])),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    states = st.sampled_from(["free"] * 5 + ["busy", "drained", "grace", "offline"])
    devices = tuple(Device(draw(states), _labels(draw) | {"all": "v"}) for _ in DEVICES)
    queue = tuple(draw(st.lists(queued(age=st.integers(1, 3)), max_size=6)))
    return Case(devices, queue, draw(queued(age=st.just(0))))


async def _seed(conn: AsyncConnection, case: Case, queue: list[tuple[uuid.UUID, Queued]]) -> None:
    """The devices in the states `case` says (a busy one running a task of its own), and the queue."""
    for n, (device_id, device) in enumerate(zip(DEVICES, case.devices, strict=True)):
        await conn.execute(
            text("UPDATE devices SET labels = CAST(:labels AS jsonb), updated_at = :t WHERE device_id = :d"),
            {"labels": json.dumps(dict(device.labels)), "t": NOW - timedelta(minutes=10 - n), "d": device_id},
        )
        if device.state == "drained":
            await conn.execute(text("UPDATE devices SET drained = true WHERE device_id = :d"), {"d": device_id})
        elif device.state == "grace":
            await conn.execute(
                text("UPDATE devices SET available_after = :t WHERE device_id = :d"),
                {"t": NOW + timedelta(seconds=5), "d": device_id},
            )
        elif device.state == "offline":
            await conn.execute(
                text("UPDATE hosts SET last_seen_at = :t WHERE host_id = :h"),
                {"t": NOW - timedelta(hours=1), "h": f"h{n + 1}"},
            )
        elif device.state == "busy":
            busy = uuid.uuid4()
            await conn.execute(
                text(
                    "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at,"
                    " updated_at, attempt_count, event_seq) VALUES (:id, 'dispatched', 0, 3, 30, '{}', :t, :t, 1, 3)"
                ),
                {"id": busy, "t": NOW - timedelta(minutes=5)},
            )
            await conn.execute(
                text(
                    "INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at,"
                    " expires_at) VALUES (:id, 1, :lease, :h, :d, 'active', :t, :e)"
                ),
                {"id": busy, "lease": uuid.uuid4(), "h": f"h{n + 1}", "d": device_id,
                 "t": NOW - timedelta(seconds=5), "e": NOW + timedelta(seconds=30)},
            )  # fmt: skip
    for task_id, q in queue:
        await conn.execute(
            text(
                "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, selector_labels,"
                " selector_device_id, created_at, updated_at, event_seq, trace_headers)"
                " VALUES (:id, 'queued', :priority, 3, :ttl, CAST(:plan AS jsonb), CAST(:labels AS jsonb), :device,"
                " :t, :t, 1, CAST(:trace AS jsonb))"
            ),
            {"id": task_id, "priority": q.priority, "ttl": 10 + q.age_s, "plan": json.dumps({"n": str(task_id)}),
             "labels": json.dumps(dict(q.labels)), "device": q.device_id, "t": NOW - timedelta(seconds=q.age_s),
             "trace": json.dumps({"traceparent": f"00-{task_id.hex}-0000000000000001-01"} if q.age_s % 2 else {})},
        )  # fmt: skip


async def _rows_of(conn: AsyncConnection, task_ids: list[uuid.UUID]) -> Mapping[str, list[str]]:
    """The rows an assignment writes for `task_ids`, lease ids and outbox ids aside (each path draws its own)."""
    queries = {
        "tasks": "SELECT to_jsonb(x) FROM tasks x WHERE task_id = ANY(:ids)",
        "attempts": "SELECT to_jsonb(x) - 'lease_id' FROM attempts x WHERE task_id = ANY(:ids)",
        "reservations": "SELECT to_jsonb(x) FROM reservations x WHERE task_id = ANY(:ids)",
        "outbox": "SELECT to_jsonb(x) - 'id' - 'xid' #- '{data,lease_id}' FROM outbox x"
        " WHERE CAST(x.data->>'task_id' AS uuid) = ANY(:ids)",
    }
    out = {}
    for table, query in queries.items():
        rows = (await conn.execute(text(query), {"ids": task_ids})).scalars().all()
        out[table] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return out


def _new_task(case: Case) -> NewTask:
    q = case.new
    return NewTask(plan={"n": "new"}, priority=q.priority, lease_ttl_s=10, selector=Selector(q.labels, q.device_id))


class Agreement:
    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store, self.clock = store, clock

    async def both(self, case: Case) -> tuple[list[Any], list[tuple[uuid.UUID, Queued]], uuid.UUID]:
        queue = [(uuid.uuid4(), q) for q in case.queue]
        new_id = uuid.uuid4()
        answers: list[Any] = []
        for path in ("loop", "placement", "looking"):
            async with self.store.engine.connect() as conn:
                tx = await conn.begin()
                await _seed(conn, case, queue)
                db = await in_transaction(conn)
                written: list[OutboxMessage] = []
                counted: int | None = None
                if path == "looking":  # the submit of a selector that found nothing free last time
                    _, counted = await tasks.submit_looking(db, self.clock, _new_task(case), new_id, written)
                else:
                    await tasks.submit(db, self.clock, _new_task(case), new_id, written)
                if path == "loop":
                    done = await assignment.assign(conn, NOW, Outbox(), limit=200, device_limit=2000, clock=self.clock)
                elif path == "placement" or counted:
                    done, found = await placement.place(db, self.clock, new_id, _new_task(case).selector, written)
                    counted = found if counted is None else counted
                else:  # the count said none: no placement
                    done = assignment.Outcome([], settled=True)
                pairs = [(m.task_id, m.device_id) for m in done.assigned]
                answers.append((pairs, done.settled, await _rows_of(conn, [t for t, _ in pairs]), counted))
                await tx.rollback()
        return answers, queue, new_id


@pytest.fixture
def agreement(database_url: str) -> Any:
    loop = asyncio.new_event_loop()
    clock = ManualClock(NOW)
    store = Store.connect(database_url, clock=clock, pool_size=1, max_overflow=0)
    for n, device_id in enumerate(DEVICES):
        loop.run_until_complete(store.register_host(f"h{n + 1}", [DeviceSpec(device_id)]))
    try:
        yield loop, Agreement(store, clock)
    finally:
        loop.run_until_complete(store.close())
        loop.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_placement_chooses_as_the_plan_and_writes_as_the_loop_does(agreement: Any, case: Case) -> None:
    loop, check = agreement
    answers, queue, new_id = loop.run_until_complete(check.both(case))
    (by_loop, _, loop_rows, _), (by_placement, settled, placed_rows, counted), looking = answers
    # a counting submit finds the free devices the placement finds, and then places as it does
    assert looking == (by_placement, settled, placed_rows, counted)
    # core's greedy plan over the queue (the new task the newest of its priority) and the free devices the
    # new task could use, in the loop's order: the placement takes its first pair
    records = [DeviceRecord(d, f"h{n + 1}", case.devices[n].labels) for n, d in enumerate(DEVICES)]
    free = [r for r, d in zip(records, case.devices, strict=True) if d.state == "free"]
    new_selector = Selector(case.new.labels, case.new.device_id)
    usable = [d for d in free if plan_assignments([QueuedTask(new_id, new_selector)], [d])]
    ordered = sorted([*queue, (new_id, case.new)], key=lambda q: (-q[1].priority, -q[1].age_s, q[0]))
    plan = plan_assignments([QueuedTask(t, Selector(q.labels, q.device_id)) for t, q in ordered], usable)
    expected = [(t.task_id, d.device_id) for t, d in plan[:1]]
    event(f"placed {'nothing' if not expected else 'the new task' if expected[0][0] == new_id else 'one ahead'}")
    assert by_placement == expected
    assert counted == min(len(usable), candidates.SUBMIT_DEVICES)
    left = len(usable) - len(expected)
    assert settled == (left == 0 or expected[0][0] == new_id)
    if len(usable) == len(free):  # the loop's first pair is then the same (it goes on to the others)
        assert by_loop[:1] == expected
    if expected and expected[0] in by_loop:  # the loop gave that task the same device: the same rows
        assert placed_rows == {
            table: [r for r in rows if expected[0][0].hex in r.replace("-", "")] for table, rows in loop_rows.items()
        }


# -- concurrency --------------------------------------------------------------------------------------------


async def test_concurrent_submits_assign_each_task_once_and_no_device_twice(
    database_url: str, clock: ManualClock
) -> None:
    store = Store.connect(database_url, clock=clock, assign_inline=True, pool_size=12, max_overflow=4)
    heard: list[Committed] = []
    store.on_commit = heard.append
    lab = Lab(store, clock)
    try:
        await lab.host("h1", *[f"a{i}" for i in range(6)])
        await lab.host("h2", *[f"b{i}" for i in range(6)], platform="ios")
        selectors = [{}, {"platform": "android"}, {"platform": "ios"}]
        # more submits than devices, racing each other and two loop passes
        calls = [store.submit(NewTask(plan=PLAN, selector=Selector(selectors[n % 3]))) for n in range(30)]
        answers = await asyncio.gather(*calls, store.assign(), store.assign())
        submitted = [a.task_id for a in answers[:30]]
        if any(c.assignable for c in heard):  # what the scheduler does: a pass when one is asked for
            while await store.assign():
                pass
        assigned = [m.event for c in heard for m in c.messages if isinstance(m.event, AttemptAssigned)]
        assert len({a.task_id for a in assigned}) == len(assigned), "a task was assigned twice"
        assert len({a.device_id for a in assigned}) == len(assigned), "a device was booked twice"
        assert len(assigned) == 12, "every device took work"
        assert any(c.operation == "submit" and placed(c) for c in heard), "submits placed tasks"
        async with store.engine.connect() as conn:
            rows = (await conn.execute(text("SELECT task_id, device_id FROM reservations"))).all()
            statuses = dict((await conn.execute(text("SELECT task_id, status FROM tasks"))).all())
        assert sorted((r.task_id, r.device_id) for r in rows) == sorted((a.task_id, a.device_id) for a in assigned)
        assert sorted(statuses[t] for t in submitted) == ["assigned"] * 12 + ["queued"] * 18
    finally:
        await store.close()
