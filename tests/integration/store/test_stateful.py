"""Random operation sequences against the real store and a small independent model of the rules.

The model is written from ARCHITECTURE.md's table directly (not from devsched.core), so the store and
the core rules are checked against a second reading of the spec. After every step the database is
checked for the invariants and the model and the store must agree on every task's status.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from sqlalchemy import text

from devsched.core.errors import Conflict
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome
from devsched.store import DeviceSpec, ManualClock, NewTask, Store

pytestmark = pytest.mark.integration

DEVICES = ("d1", "d2", "d3")
PLAN = {"steps": [{"name": "s", "action": "noop", "args": {}}]}
TTL = 10
#: Releases a task may have before the next one fails it (small, so the bound is reached).
MAX_RELEASES = 1


@dataclass
class MAttempt:
    lease: LeaseRef
    device: str
    expires_at: datetime
    status: str = "active"
    cancel: bool = False


@dataclass
class MTask:
    max_attempts: int
    status: str = "queued"
    attempts: list[MAttempt] = field(default_factory=list)
    releases: int = 0

    @property
    def current(self) -> MAttempt | None:
        return self.attempts[-1] if self.attempts else None


class StoreMachine(RuleBasedStateMachine):
    url: str

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store = Store.connect(self.url, clock=self.clock, pool_size=2, max_overflow=0, max_releases=MAX_RELEASES)
        self.tasks: dict[uuid.UUID, MTask] = {}
        self.grace_until: dict[str, datetime] = {}
        self.run(self._reset())

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    async def _reset(self) -> None:
        async with self.store.engine.begin() as conn:
            await conn.execute(text("TRUNCATE outbox, cancel_requests, attempts, tasks, devices, hosts CASCADE"))
        await self.store.register_host("h1", [DeviceSpec(d) for d in DEVICES])
        await self.store.register_host("h2", [])

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    # -- helpers -------------------------------------------------------------------------------

    def _now(self) -> datetime:
        return self.clock.current

    def _busy(self) -> set[str]:
        return {a.device for t in self.tasks.values() for a in t.attempts if a.status == "active"}

    def _live(self, t: MTask, a: MAttempt) -> bool:
        return a is t.current and a.status == "active" and self._now() < a.expires_at

    def _pick(self, data: st.DataObject) -> tuple[MTask, MAttempt]:
        with_attempts = [t for t in self.tasks.values() if t.attempts]
        t = data.draw(st.sampled_from(with_attempts))
        return t, data.draw(st.sampled_from(t.attempts))

    # -- rules ---------------------------------------------------------------------------------

    @rule(max_attempts=st.integers(1, 2))
    def submit(self, max_attempts: int) -> None:
        self.clock.advance(0.001)  # distinct submit times: assignment order must not depend on random ids
        sub = self.run(self.store.submit(NewTask(plan=PLAN, max_attempts=max_attempts, lease_ttl_s=TTL)))
        self.tasks[sub.task_id] = MTask(max_attempts)

    @rule()
    def assign(self) -> None:
        free = [d for d in DEVICES if d not in self._busy() and self.grace_until.get(d, self._now()) <= self._now()]
        queued = [i for i, t in self.tasks.items() if t.status == "queued"]
        got = self.run(self.store.assign())
        assert len(got) == min(len(free), len(queued))
        assert len({m.device_id for m in got}) == len(got)
        for m in got:
            t = self.tasks[m.task_id]
            assert t.status == "queued"
            assert m.device_id in free
            assert m.attempt == len(t.attempts) + 1
            t.status = "assigned"
            t.attempts.append(
                MAttempt(LeaseRef(m.host_id, m.task_id, m.attempt, m.lease_id), m.device_id, m.expires_at)
            )

    @precondition(lambda self: any(t.attempts for t in self.tasks.values()))
    @rule(data=st.data(), foreign=st.booleans(), claim=st.booleans())
    def extend(self, data: st.DataObject, foreign: bool, claim: bool) -> None:
        t, a = self._pick(data)
        lease = LeaseRef("h2", a.lease.task_id, a.lease.attempt, a.lease.lease_id) if foreign else a.lease
        ok = self._live(t, a) and not foreign and t.status in ("assigned", "dispatched")
        try:
            grant = self.run(self.store.claim(lease) if claim else self.store.renew(lease))
        except Conflict:
            assert not ok
            return
        assert ok
        assert grant.cancel_requested == a.cancel
        a.expires_at = self._now() + timedelta(seconds=TTL)
        if claim:
            t.status = "dispatched"

    @precondition(lambda self: any(t.attempts for t in self.tasks.values()))
    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def report(self, data: st.DataObject, outcome: Outcome) -> None:
        t, a = self._pick(data)
        duplicate = a.status == outcome.value
        ok = duplicate or (
            self._live(t, a)
            and (outcome is not Outcome.CANCELLED or a.cancel)
            and t.status in ("assigned", "dispatched")
        )
        try:
            receipt = self.run(self.store.report(a.lease, outcome))
        except Conflict:
            assert not ok
            return
        assert ok
        assert receipt.duplicate == duplicate
        if not duplicate:
            a.status = t.status = outcome.value

    @precondition(lambda self: any(t.attempts for t in self.tasks.values()))
    @rule(data=st.data(), foreign=st.booleans())
    def release(self, data: st.DataObject, foreign: bool) -> None:
        # ARCHITECTURE.md: "the owning host releases the attempt: queued (or cancelled if a cancellation is
        # pending)", device free at once; past the bound on releases, failed.
        t, a = self._pick(data)
        lease = LeaseRef("h2", a.lease.task_id, a.lease.attempt, a.lease.lease_id) if foreign else a.lease
        duplicate = not foreign and a.status == "released"
        ok = duplicate or (not foreign and self._live(t, a) and t.status in ("assigned", "dispatched"))
        try:
            receipt = self.run(self.store.release(lease))
        except Conflict:
            assert not ok
            return
        assert ok
        assert receipt.duplicate == duplicate
        if not duplicate:
            a.status = "released"
            if a.cancel:
                t.status = "cancelled"
            elif t.releases >= MAX_RELEASES:
                t.status = "failed"
            else:
                t.status = "queued"
            t.releases += 1
        assert receipt.status.value == t.status

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(list(self.tasks)))  # submission order: replayable
        t = self.tasks[task_id]
        receipt = self.run(self.store.request_cancel(task_id))
        if t.status == "queued":
            t.status = "cancelled"
        elif t.status in ("assigned", "dispatched"):
            assert t.current is not None
            t.current.cancel = True
        assert receipt.status.value == t.status
        assert receipt.cancel_requested == (t.status in ("assigned", "dispatched"))

    @rule(seconds=st.sampled_from([1, 4, 9, 11, 25]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.run(self.store.heartbeat("h1"))
        self.run(self.store.heartbeat("h2"))

    @rule()
    def sweep(self) -> None:
        expect = {
            i
            for i, t in self.tasks.items()
            if t.current is not None and t.current.status == "active" and t.current.expires_at <= self._now()
        }
        got = self.run(self.store.sweep_expired())
        assert {e.task_id for e in got} == expect
        for e in got:
            t = self.tasks[e.task_id]
            a = t.current
            assert a is not None
            a.status = "expired"
            self.grace_until[a.device] = self._now() + timedelta(seconds=TTL)
            if a.cancel:
                t.status = "cancelled"
            elif len(t.attempts) - t.releases >= t.max_attempts:
                t.status = "failed"
            else:
                t.status = "queued"
            assert e.task_status.value == t.status

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_invariants_hold(self) -> None:
        async def check() -> None:
            async with self.store.engine.connect() as conn:
                one = await conn.execute(
                    text(
                        "SELECT max(n) FROM (SELECT count(*) n FROM reservations WHERE attempt_status = 'active' "
                        "GROUP BY device_id) x"
                    )
                )
                assert (one.scalar_one() or 0) <= 1, "a device has two active reservations"
                act = await conn.execute(
                    text(
                        "SELECT max(n) FROM (SELECT count(*) n FROM attempts WHERE status = 'active' "
                        "GROUP BY task_id) x"
                    )
                )
                assert (act.scalar_one() or 0) <= 1, "a task has two active attempts"
                gaps = await conn.execute(
                    text(
                        "SELECT count(*) FROM (SELECT task_id, max(attempt) m, count(*) c FROM attempts "
                        "GROUP BY task_id) x WHERE m <> c"
                    )
                )
                assert gaps.scalar_one() == 0, "attempt numbers have gaps"
                rows = (
                    await conn.execute(
                        text(
                            "SELECT t.task_id, t.status, t.attempt_count, t.max_attempts, t.releases,"
                            " (SELECT count(*) FROM attempts a WHERE a.task_id = t.task_id"
                            "  AND a.status = 'released') AS released FROM tasks t"
                        )
                    )
                ).all()
                for r in rows:
                    assert r.attempt_count <= r.max_attempts + r.releases
                    assert r.releases == r.released == self.tasks[r.task_id].releases
                    assert r.status == self.tasks[r.task_id].status, f"store {r.status} vs model for {r.task_id}"
                ended = await conn.execute(
                    text("SELECT count(*) FROM attempts WHERE status <> 'active' AND end_reason IS NULL")
                )
                assert ended.scalar_one() == 0

        self.run(check())


def test_random_operation_sequences_keep_the_invariants(database_url: str) -> None:
    StoreMachine.url = database_url
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
