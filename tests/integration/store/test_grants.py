"""The one-statement grants agree with the locked path on every state: the same answer, the same rows written.

A claim or renewal's locked path runs the same statement under the task's lock, so for those the locked
path's answer is also checked against core's `decide_claim` / `decide_renew` on the rows it locked.

Hypothesis generates a task with attempts in any combination of statuses, owners, expiries (either side of
the clock, and exactly on it), progress and cancellation requests, and a claim, renewal or report from a
registered or unknown host naming any attempt with the right or a wrong lease. Each request runs twice on
that state, in a transaction rolled back afterwards: through the locked path (`devsched.store.leasing`,
where core's `decide_*` decide) and through `devsched.store.grants`. Where core grants it, the grant must
return the same value and leave every table exactly as the locked path does (outbox rows included, to the
character); where core refuses it (or answers a duplicate), the grant must do nothing but record the host's
sign of life, as the locked path does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict, DevschedError
from devsched.core.leases import decide_claim, decide_renew
from devsched.core.records import LeaseRef
from devsched.core.status import AttemptStatus, Outcome, TaskStatus
from devsched.store import DeviceSpec, ManualClock, Store, grants, leasing
from devsched.store.driver import Driver
from devsched.store.liveness import Rejected, touch_host
from devsched.store.outbox import Outbox
from devsched.store.rows import lock_task, named_attempt

pytestmark = pytest.mark.integration

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TTL = 30
HOSTS = {"h1": "d1", "h2": "d2"}
PROGRESS = (None, {"step": "a", "index": 0, "of": 2}, {"step": "b", "index": 1, "of": 2})
#: Expiries around the clock: a lease at exactly its expiry is expired.
OFFSETS = (-10.0, -0.000001, 0.0, 0.000001, 10.0)


@dataclass(frozen=True)
class Attempt:
    status: AttemptStatus
    host_id: str
    expires_in_s: float
    dispatched: bool
    progress: int
    cancel_requested: bool
    lease_id: uuid.UUID


@dataclass(frozen=True)
class State:
    status: TaskStatus
    attempts: tuple[Attempt, ...]
    attempt_count: int
    max_attempts: int


@dataclass(frozen=True)
class Request:
    kind: str  # "claim", "renew" or "report"
    host_id: str
    attempt: int
    right_lease: bool
    progress: int
    outcome: Outcome


ANY_STATUS = st.sampled_from(list(AttemptStatus))


def attempts(status: st.SearchStrategy[AttemptStatus] = ANY_STATUS) -> st.SearchStrategy[Attempt]:
    return st.builds(
        Attempt,
        status=status,
        host_id=st.sampled_from(sorted(HOSTS)),
        expires_in_s=st.sampled_from(OFFSETS[::-1]),
        dispatched=st.booleans(),
        progress=st.integers(0, len(PROGRESS) - 1),
        cancel_requested=st.booleans(),
        lease_id=st.uuids(),
    )


#: Mostly true: hypothesis favours the first value, and most requests in production are the usual case.
MOSTLY = st.sampled_from([True, True, True, False])


@st.composite
def states(draw: st.DrawFn) -> State:
    shape = draw(st.sampled_from(["in flight", "live attempt", "count behind", "anything"]))
    if shape != "anything":  # the newest attempt live: in production its task is in flight
        live = draw(attempts(st.just(AttemptStatus.ACTIVE)))
        made = [_ended(a) for a in draw(st.lists(attempts(), min_size=shape == "count behind", max_size=2))]
        made.append(live)
        in_flight = [TaskStatus.DISPATCHED, TaskStatus.ASSIGNED]
        status = draw(st.sampled_from(in_flight if shape == "in flight" else list(TaskStatus)))
        # "count behind": the task's counter names an older attempt than the live one (never in production)
        count = len(made) - 1 if shape == "count behind" else len(made)
        return State(status, tuple(made), count, max(len(made), draw(st.integers(1, 3))))
    made = draw(st.lists(attempts(), max_size=3))
    # at most one active attempt per task (a unique index); usually the newest
    active = [i for i, a in enumerate(made) if a.status is AttemptStatus.ACTIVE]
    made = [a if i in active[-1:] else _ended(a) for i, a in enumerate(made)]
    count = draw(st.sampled_from([len(made), max(len(made) - 1, 0)]))
    status = draw(st.sampled_from(list(TaskStatus)))
    assume(status not in (TaskStatus.ASSIGNED, TaskStatus.DISPATCHED) or count >= 1)
    return State(status, tuple(made), count, max(count, draw(st.integers(1, 3))))


def _ended(a: Attempt) -> Attempt:
    if a.status is not AttemptStatus.ACTIVE:
        return a
    return Attempt(AttemptStatus.EXPIRED, a.host_id, a.expires_in_s, a.dispatched, a.progress, False, a.lease_id)


@st.composite
def cases(draw: st.DrawFn, kind: str, outcome: Outcome) -> tuple[State, Request]:
    """A state, and a request that mostly names its current attempt, as its owner, with its lease."""
    state = draw(states())
    live = [n for n, a in enumerate(state.attempts, start=1) if a.status is AttemptStatus.ACTIVE]
    named_as = draw(st.sampled_from(["current", "current", "live", "any"]))
    if named_as == "current" and state.attempt_count:
        attempt = state.attempt_count
    elif named_as == "live" and live:  # the active attempt, which need not be the current one
        attempt = live[0]
    else:
        attempt = draw(st.integers(1, 4))
    named = state.attempts[attempt - 1] if attempt <= len(state.attempts) else None
    owner = named.host_id if named is not None and draw(MOSTLY) else None
    request = Request(
        kind=kind,
        host_id=owner or draw(st.sampled_from([*sorted(HOSTS), "h3"])),
        attempt=attempt,
        right_lease=draw(MOSTLY),
        progress=draw(st.integers(0, len(PROGRESS) - 1)),
        outcome=outcome,
    )
    return state, request


async def _seed(conn: AsyncConnection, task_id: uuid.UUID, state: State) -> None:
    await conn.execute(
        text(
            "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at, updated_at,"
            " attempt_count, event_seq) VALUES (:id, :status, 0, :max, :ttl, '{}', :t, :t, :count, 7)"
        ),
        {"id": task_id, "status": state.status.value, "max": state.max_attempts, "ttl": TTL,
         "t": NOW - timedelta(minutes=5), "count": state.attempt_count},
    )  # fmt: skip
    for n, a in enumerate(state.attempts, start=1):
        ended = a.status is not AttemptStatus.ACTIVE
        end_reason = "lease_expired" if a.status is AttemptStatus.EXPIRED else a.status.value
        await conn.execute(
            text(
                "INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at,"
                " dispatched_at, expires_at, ended_at, end_reason, progress)"
                " VALUES (:id, :n, :lease, :host, :device, :status, :assigned, :dispatched, :expires, :ended,"
                " :reason, CAST(:progress AS jsonb))"
            ),
            {"id": task_id, "n": n, "lease": a.lease_id, "host": a.host_id, "device": HOSTS[a.host_id],
             "status": a.status.value, "assigned": NOW - timedelta(minutes=1),
             "dispatched": NOW - timedelta(seconds=50) if a.dispatched else None,
             "expires": NOW + timedelta(seconds=a.expires_in_s),
             "ended": NOW - timedelta(seconds=1) if ended else None, "reason": end_reason if ended else None,
             "progress": json.dumps(PROGRESS[a.progress]) if PROGRESS[a.progress] else None},
        )  # fmt: skip
        if a.cancel_requested:
            await conn.execute(
                text("INSERT INTO cancel_requests (task_id, attempt, requested_at) VALUES (:id, :n, :t)"),
                {"id": task_id, "n": n, "t": NOW - timedelta(seconds=5)},
            )


def _ref(task_id: uuid.UUID, state: State, req: Request) -> LeaseRef:
    named = state.attempts[req.attempt - 1] if req.attempt <= len(state.attempts) else None
    lease = named.lease_id if named is not None and req.right_lease else uuid.uuid4()
    return LeaseRef(req.host_id, task_id, req.attempt, lease)


async def _locked(conn: AsyncConnection, clock: ManualClock, ref: LeaseRef, req: Request) -> object:
    """The locked path's answer: its value, or the class of the conflict (a duplicate is not a grant)."""
    now = await clock.now(conn)
    progress = PROGRESS[req.progress]
    try:
        if req.kind == "report":
            answer: object = await leasing.report(
                conn, now, Outbox(), ref, req.outcome, "why", {"steps": []}, clock
            )  # fmt: skip
        else:
            expected = await _core(conn, clock, ref, req)
            answer = await leasing.extend(conn, now, [], ref, claim=req.kind == "claim", clock=clock, progress=progress)
            got = type(answer.error) if isinstance(answer, Rejected) else answer
            assert got == expected, f"the store answers {got}, core {expected}"
    except DevschedError as exc:
        return type(exc)
    if isinstance(answer, Rejected):
        return type(answer.error)
    if getattr(answer, "duplicate", False):
        return "duplicate"
    return answer


async def _core(conn: AsyncConnection, clock: ManualClock, ref: LeaseRef, req: Request) -> object:
    """Core's answer to a claim or renewal on the rows as they are (read under the task's lock, writing nothing):
    the grant, or the class of the conflict. The store's locked path grants with the statement itself, so
    this is what keeps the statement honest where it grants."""
    await touch_host(conn, ref.host_id, await clock.now(conn))  # an unknown host: NotFound, as the store says
    task = await lock_task(conn, ref.task_id)
    named, _ = await named_attempt(conn, task, ref.attempt)
    decide = decide_claim if req.kind == "claim" else decide_renew
    try:
        return decide(task, named, ref, await clock.now(conn))
    except Conflict as exc:
        return type(exc)


async def _granted(
    conn: AsyncConnection, clock: ManualClock, ref: LeaseRef, req: Request, *, touch: bool = True
) -> object:
    db = Driver((await conn.get_raw_connection()).driver_connection)
    if req.kind == "report":
        return await grants.report(db, clock, ref, req.outcome, "why", {"steps": []}, touch=touch)
    if req.kind == "claim":
        return await grants.claim(db, clock, ref, PROGRESS[req.progress], touch=touch)
    return await grants.renew(db, clock, ref, PROGRESS[req.progress], touch=touch)


async def _tables(conn: AsyncConnection) -> Mapping[str, list[Any]]:
    out = {}
    for table in ("hosts", "devices", "tasks", "attempts", "reservations", "cancel_requests", "outbox"):
        rows = (await conn.execute(text(f"SELECT to_jsonb(x) - 'id' - 'xid' FROM {table} x"))).scalars().all()
        out[table] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    # the order events are published in (a claim with progress writes `dispatched`, then `progress`)
    order = text("SELECT data->>'kind', data->>'seq' FROM outbox ORDER BY id")
    out["outbox order"] = [tuple(r) for r in (await conn.execute(order)).all()]
    return out


class Agreement:
    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store, self.clock = store, clock

    async def both(
        self, state: State, req: Request, *, touch: bool = True
    ) -> tuple[object, object, Mapping[str, Any], Mapping[str, Any]]:
        """Both paths' answers and tables; without `touch`, the grant's leaves the host's sign of life out."""
        task_id = uuid.uuid4()
        ref = _ref(task_id, state, req)
        answers, tables = [], []
        for path in (_locked, functools.partial(_granted, touch=touch)):
            async with self.store.engine.connect() as conn:
                tx = await conn.begin()
                await _seed(conn, task_id, state)
                answers.append(await path(conn, self.clock, ref, req))
                tables.append(await _tables(conn))
                await tx.rollback()
        return answers[0], answers[1], tables[0], tables[1]

    async def hosts(self) -> list[Any]:
        """The hosts' rows as the cases start from them."""
        async with self.store.engine.connect() as conn:
            return list((await _tables(conn))["hosts"])


@pytest.fixture
def agreement(database_url: str) -> Any:
    loop = asyncio.new_event_loop()
    clock = ManualClock(NOW - timedelta(seconds=10))
    store = Store.connect(database_url, clock=clock, pool_size=1, max_overflow=0)
    loop.run_until_complete(store.register_host("h1", [DeviceSpec("d1")]))
    loop.run_until_complete(store.register_host("h2", [DeviceSpec("d2")]))
    clock.advance(10)
    try:
        yield loop, Agreement(store, clock)
    finally:
        loop.run_until_complete(store.close())
        loop.close()


@pytest.mark.parametrize("touch", [True, False], ids=["touching", "untouched"])
@pytest.mark.parametrize(
    ("kind", "outcome"),
    [("claim", Outcome.DONE), ("renew", Outcome.DONE), *(("report", o) for o in Outcome)],
    ids=["claim", "renew", *(f"report-{o.value}" for o in Outcome)],
)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_statement_grants_agree_with_the_locked_path(
    agreement: Any, kind: str, outcome: Outcome, touch: bool, data: st.DataObject
) -> None:
    """`untouched`: a request of a host whose sign of life was recorded a moment ago (`RecentSigns`)
    agrees on everything but the hosts' rows, which its grant leaves as they were."""
    loop, check = agreement
    state, req = data.draw(cases(kind, outcome))
    locked, granted, locked_rows, granted_rows = loop.run_until_complete(check.both(state, req, touch=touch))
    if not touch:
        seeded = loop.run_until_complete(check.hosts())
        assert granted_rows["hosts"] == seeded, "the hosts' rows are left as they were"
        locked_rows = {**locked_rows, "hosts": seeded}
    event(
        f"{req.kind}: {locked.__name__ if isinstance(locked, type) else locked if locked == 'duplicate' else 'granted'}"
    )
    if isinstance(locked, type) or locked == "duplicate":
        assert granted is None, f"core answers {locked}, the one statement granted {granted}"
    else:
        assert granted == locked
    assert granted_rows == locked_rows
