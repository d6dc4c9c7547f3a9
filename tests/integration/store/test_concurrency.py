"""Races with real concurrent database sessions: several Stores, each with its own connection pool."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest
from sqlalchemy import text

from devsched.core.errors import LeaseExpired
from devsched.core.status import AttemptStatus, Outcome, TaskStatus
from devsched.store import DeviceSpec, ManualClock, NewTask, Store
from support.polling import eventually
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

PLAN = {"steps": [{"name": "s", "action": "noop", "args": {}}]}


@pytest.fixture
async def stores(database_url: str, clock: ManualClock) -> AsyncIterator[Callable[[ManualClock | None], Store]]:
    made: list[Store] = []

    def make(own_clock: ManualClock | None = None) -> Store:
        s = Store.connect(database_url, clock=own_clock or clock, pool_size=4)
        made.append(s)
        return s

    yield make
    await asyncio.gather(*(s.close() for s in made))


async def _active_per_device(store: Store) -> Counter[str]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(text("SELECT device_id FROM attempts WHERE status = 'active'"))
        return Counter(rows.scalars())


async def test_many_assigners_never_reserve_one_device_twice(lab: Lab, stores: Callable[..., Store]) -> None:
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(10)])
    for _ in range(60):
        await lab.store.submit(NewTask(plan=PLAN))
    assigners = [stores() for _ in range(6)]

    async def keep_assigning(s: Store) -> int:
        total = 0
        for _ in range(5):
            total += len(await s.assign(limit=7))
        return total

    counts = await asyncio.gather(*(keep_assigning(s) for s in assigners))
    assert sum(counts) == 10, "every device assigned exactly once across all assigners"
    per_device = await _active_per_device(lab.store)
    assert len(per_device) == 10
    assert set(per_device.values()) == {1}


async def test_two_sweepers_never_requeue_one_attempt_twice(lab: Lab, stores: Callable[..., Store]) -> None:
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(40)])
    for _ in range(40):
        await lab.store.submit(NewTask(plan=PLAN, max_attempts=3))
    assert len(await lab.store.assign(limit=100)) == 40
    lab.clock.advance(31)
    await lab.alive()
    a, b = stores(), stores()
    results = await asyncio.gather(*(s.sweep_expired(limit=7) for s in (a, b, a, b, a, b, a, b, a, b)))
    swept = [e.task_id for batch in results for e in batch]
    swept += [e.task_id for e in await lab.store.sweep_expired()]  # whatever the racing batches left
    assert len(swept) == 40
    assert len(set(swept)) == 40, "no attempt was expired twice"
    async with lab.store.engine.connect() as conn:
        events = Counter(
            (await conn.execute(text("SELECT data->>'kind' FROM outbox WHERE kind = 'task_event'"))).scalars()
        )
    assert events["requeued"] == 40
    page = await lab.store.list_tasks(limit=100)
    assert {t.status for t in page.tasks} == {TaskStatus.QUEUED}
    assert {t.attempt_count for t in page.tasks} == {1}


async def test_report_racing_the_sweeper_ends_in_exactly_one_outcome(
    lab: Lab, stores: Callable[..., Store], clock: ManualClock
) -> None:
    """The reporter's clock says the lease is live, the sweeper's says expired: the row lock decides."""
    n = 30
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(n)])
    for _ in range(n):
        await lab.store.submit(NewTask(plan=PLAN, max_attempts=2))
    leases = [ref(m) for m in await lab.store.assign(limit=100)]
    assert len(leases) == n
    early, late = ManualClock(clock.advance(29)), ManualClock(clock.current)
    late.advance(2)
    reporter, sweeper = stores(early), stores(late)
    await lab.alive()

    async def report(lease: object) -> str:
        try:
            await reporter.report(lease, Outcome.DONE)  # type: ignore[arg-type]
        except LeaseExpired:
            return "rejected"
        return "reported"

    async def sweep() -> list[object]:
        out: list[object] = []
        for _ in range(10):
            out += await sweeper.sweep_expired(limit=5)
        return out

    outcomes, swept = await asyncio.gather(asyncio.gather(*(report(x) for x in leases)), sweep())
    swept_ids = {e.task_id for e in swept}  # type: ignore[attr-defined]
    for lease, outcome in zip(leases, outcomes, strict=True):
        view = await lab.store.get_task(lease.task_id)
        (attempt,) = view.attempts
        if outcome == "reported":
            assert view.status is TaskStatus.DONE
            assert attempt.status is AttemptStatus.DONE
            assert lease.task_id not in swept_ids
        else:
            assert view.status is TaskStatus.QUEUED
            assert attempt.status is AttemptStatus.EXPIRED
            assert lease.task_id in swept_ids
    assert set(outcomes) <= {"reported", "rejected"}


async def test_concurrent_submits_with_one_idempotency_key_create_one_task(
    lab: Lab, stores: Callable[..., Store]
) -> None:
    submitters = [stores() for _ in range(4)]
    results = await asyncio.gather(
        *(s.submit(NewTask(plan=PLAN, idempotency_key="ci-run-1")) for s in submitters for _ in range(3))
    )
    assert len({r.task_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert len((await lab.store.list_tasks()).tasks) == 1


async def test_cancel_racing_report_ends_in_one_terminal_state(lab: Lab, stores: Callable[..., Store]) -> None:
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(20)])
    for _ in range(20):
        await lab.store.submit(NewTask(plan=PLAN))
    leases = [ref(m) for m in await lab.store.assign(limit=100)]
    canceller, reporter = stores(), stores()
    await asyncio.gather(
        *(canceller.request_cancel(x.task_id) for x in leases),
        *(reporter.report(x, Outcome.DONE) for x in leases),
    )
    for lease in leases:
        view = await lab.store.get_task(lease.task_id)
        assert view.status is TaskStatus.DONE  # the report wins: a late request on a terminal task is a no-op
        assert not view.cancel_requested


async def test_renewal_racing_the_sweeper_is_renewed_or_swept_never_both(
    lab: Lab, stores: Callable[..., Store], clock: ManualClock
) -> None:
    """The renewer's clock says live, the sweeper's expired: the attempt row decides, as with a report."""
    n = 30
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(n)])
    for _ in range(n):
        await lab.store.submit(NewTask(plan=PLAN, max_attempts=2))
    leases = [ref(m) for m in await lab.store.assign(limit=100)]
    early, late = ManualClock(clock.advance(29)), ManualClock(clock.current)
    late.advance(2)
    renewer, sweeper = stores(early), stores(late)
    await lab.alive()

    async def renew(lease: object) -> str:
        try:
            await renewer.renew(lease)  # type: ignore[arg-type]
        except LeaseExpired:
            return "rejected"
        return "renewed"

    async def sweep() -> list[object]:
        out: list[object] = []
        for _ in range(10):
            out += await sweeper.sweep_expired(limit=5)
        return out

    outcomes, swept = await asyncio.gather(asyncio.gather(*(renew(x) for x in leases)), sweep())
    swept_ids = {e.task_id for e in swept}  # type: ignore[attr-defined]
    for lease, outcome in zip(leases, outcomes, strict=True):
        view = await lab.store.get_task(lease.task_id)
        (attempt,) = view.attempts
        if outcome == "renewed":
            assert lease.task_id not in swept_ids
            assert attempt.status is AttemptStatus.ACTIVE
            assert attempt.expires_at == early.current + timedelta(seconds=30)
        else:
            assert lease.task_id in swept_ids
            assert attempt.status is AttemptStatus.EXPIRED
    assert set(outcomes) <= {"renewed", "rejected"}


async def test_claims_and_new_steps_racing_cancels_number_every_event_once(
    lab: Lab, stores: Callable[..., Store]
) -> None:
    """Claims, renewals at a new step and cancellations of the same tasks from other sessions, at once."""
    n = 20
    await lab.store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(n)])
    for _ in range(n):
        await lab.store.submit(NewTask(plan=PLAN))
    leases = [ref(m) for m in await lab.store.assign(limit=100)]
    hosts, cancellers = stores(), stores()

    async def run(lease: object) -> None:
        await hosts.claim(lease)  # type: ignore[arg-type]
        for index in range(3):
            await hosts.renew(lease, {"step": f"s{index}", "index": index, "of": 3})  # type: ignore[arg-type]

    await asyncio.gather(*(run(x) for x in leases), *(cancellers.request_cancel(x.task_id) for x in leases))
    async with lab.store.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT data->>'task_id' AS task_id, array_agg((data->>'seq')::int ORDER BY id) AS seqs,"
                    " array_agg(data->>'kind' ORDER BY id) AS kinds"
                    " FROM outbox WHERE kind = 'task_event' GROUP BY 1"
                )
            )
        ).all()
        counters = dict((await conn.execute(text("SELECT task_id::text, event_seq FROM tasks"))).all())
    for row in rows:
        assert sorted(row.seqs) == list(range(1, counters[row.task_id] + 1)), "each number taken exactly once"
        kinds = Counter(row.kinds)
        assert kinds["dispatched"] == 1
        assert kinds["cancel_requested"] == 1
        assert kinds["progress"] == 3
    for lease in leases:
        assert (await hosts.renew(lease, {"step": "s2", "index": 2, "of": 3})).cancel_requested


async def test_a_claim_that_waited_for_a_cancellation_sees_it(lab: Lab) -> None:
    """A one-statement claim blocked by a cancellation holding the task row must not answer from its snapshot."""
    await lab.host("h1", "d1")
    lease = await lab.assign_one(await lab.submit())
    async with lab.store.engine.connect() as canceller:
        tx = await canceller.begin()  # as request_cancel does it, held open
        await canceller.execute(text("SELECT 1 FROM tasks WHERE task_id = :id FOR UPDATE"), {"id": lease.task_id})
        await canceller.execute(
            text("INSERT INTO cancel_requests (task_id, attempt, requested_at) VALUES (:id, 1, now())"),
            {"id": lease.task_id},
        )
        await canceller.execute(
            text("UPDATE tasks SET event_seq = event_seq + 1 WHERE task_id = :id"), {"id": lease.task_id}
        )
        claim = asyncio.ensure_future(lab.store.claim(lease))

        async def waiting() -> bool:
            async with lab.store.engine.connect() as conn:
                query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                return bool((await conn.execute(text(query))).scalar_one())

        await eventually(waiting, message="the claim waits for the task row")
        await tx.commit()
    grant = await claim
    assert grant.cancel_requested
    assert grant.dispatch
