"""The one-statement grants agree with the locked path on every state: the same answer, the same rows written.

The locked path runs the same statement under the task's lock, so its answer is also checked against core's
`decide_claim` / `decide_renew` / `decide_report` on the rows it locked.

Hypothesis generates a task with attempts in any combination of statuses, owners, expiries (either side of
the clock, and exactly on it), progress and cancellation requests, and a claim, renewal or report from a
registered or unknown host naming any attempt with the right or a wrong lease; a report's task may be a
health check, have a retry policy or a plan with an infrastructure step, its result may name that step
failing, and its devices may have failed before or be quarantined. Each request runs twice on
that state, in a transaction rolled back afterwards: through the locked path (`devsched.store.leasing`,
where core's `decide_*` decide) and through `devsched.store.grants`. Where core grants it, the grant must
return the same value and leave every table exactly as the locked path does (outbox rows included, to the
character); where core refuses it (or answers a duplicate), the grant must do nothing but record the host's
sign of life, as the locked path does. A report core accepts that needs more than the statement does (a retry,
a device's failure count or a health check's verdict) is refused by the statement, which then writes only the
sign of life, and the locked path does it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict, DevschedError
from devsched.core.leases import ReportKind, decide_claim, decide_renew, decide_report
from devsched.core.records import LeaseRef
from devsched.core.retrying import failure_cause
from devsched.core.status import AttemptStatus, Outcome, TaskStatus
from devsched.store import DeviceSpec, ManualClock, Store, grants, leasing
from devsched.store.driver import Driver
from devsched.store.liveness import Rejected, touch_host
from devsched.store.outbox import Outbox
from devsched.store.rows import lock_task, named_attempt
from devsched.store.views import ReportReceipt

pytestmark = pytest.mark.integration

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TTL = 30
HOSTS = {"h1": "d1", "h2": "d2"}
PROGRESS = (None, {"step": "a", "index": 0, "of": 2}, {"step": "b", "index": 1, "of": 2})
#: Expiries around the clock: a lease at exactly its expiry is expired.
OFFSETS = (-10.0, -0.000001, 0.0, 0.000001, 10.0)
#: A plan with an infrastructure step, and a report's results: nothing failing, or that step failing.
INFRA_PLAN = {"steps": [{"name": "flash", "action": "shell", "infra": True}]}
RESULTS: tuple[dict[str, Any], ...] = ({"steps": []}, {"steps": [{"name": "flash", "status": "failed"}]})
#: Report reasons: a plain one, and the agent's for the two time limits.
REASONS = ("why", "attempt_timeout", "deadline_exceeded")
RETRY_POLICIES = (
    None,
    {"on": ["infra"], "backoff": {"initial_s": 5, "max_s": 300, "multiplier": 2}},
    {"on": ["infra", "step_failed", "attempt_timeout"], "backoff": {"initial_s": 1, "max_s": 1, "multiplier": 1}},
)


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
class Task:
    """What makes a report more than the end of its task (for a report; a claim's or renewal's is the default)."""

    health: bool = False
    retry: int = 0
    infra_plan: bool = False
    #: The devices' consecutive infrastructure failures before, and whether they are quarantined.
    device_failures: int = 0
    quarantined: bool = False


@dataclass(frozen=True)
class State:
    status: TaskStatus
    attempts: tuple[Attempt, ...]
    attempt_count: int
    max_attempts: int
    task: Task = Task()


@dataclass(frozen=True)
class Request:
    kind: str  # "claim", "renew" or "report"
    host_id: str
    attempt: int
    right_lease: bool
    progress: int
    outcome: Outcome
    result: int = 0
    reason: str = REASONS[0]


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
def states(draw: st.DrawFn, *, flying: bool = False) -> State:
    shapes = ["in flight"] if flying else ["in flight", "live attempt", "count behind", "anything"]
    shape = draw(st.sampled_from(shapes))
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
def cases(draw: st.DrawFn, kind: str, outcome: Outcome, *, needs_more: bool = False) -> tuple[State, Request]:
    """A state, and a request that mostly names its current attempt, as its owner, with its lease.

    `needs_more`: a report on an in-flight task that may need more than its end (`Task`), naming its
    current attempt.
    """
    state = draw(states(flying=needs_more))
    if needs_more and draw(MOSTLY):  # its lease mostly live, attempts mostly left (a retry policy may retry)
        *before, newest = state.attempts
        live_lease = replace(newest, expires_in_s=OFFSETS[-1])
        state = replace(state, attempts=(*before, live_lease), max_attempts=min(state.attempt_count + 1, 100))
    live = [n for n, a in enumerate(state.attempts, start=1) if a.status is AttemptStatus.ACTIVE]
    named_as = "current" if needs_more else draw(st.sampled_from(["current", "current", "live", "any"]))
    if named_as == "current" and state.attempt_count:
        attempt = state.attempt_count
    elif named_as == "live" and live:  # the active attempt, which need not be the current one
        attempt = live[0]
    else:
        attempt = draw(st.integers(1, 4))
    named = state.attempts[attempt - 1] if attempt <= len(state.attempts) else None
    owner = named.host_id if named is not None and (needs_more or draw(MOSTLY)) else None
    # mostly a plain report's (hypothesis shrinks towards one), unless `needs_more`
    if kind == "report" and (needs_more or not draw(MOSTLY)):
        task = draw(
            st.builds(
                Task,
                health=st.booleans(),
                retry=st.integers(0, len(RETRY_POLICIES) - 1),
                infra_plan=st.booleans(),
                device_failures=st.sampled_from([0, 2]),
                quarantined=st.booleans(),
            )
        )
        state = replace(state, task=task)
    request = Request(
        kind=kind,
        host_id=owner or draw(st.sampled_from([*sorted(HOSTS), "h3"])),
        attempt=attempt,
        right_lease=draw(MOSTLY),
        progress=draw(st.integers(0, len(PROGRESS) - 1)),
        outcome=outcome,
        result=draw(st.integers(0, len(RESULTS) - 1)) if kind == "report" else 0,
        reason=draw(st.sampled_from(REASONS)) if kind == "report" else REASONS[0],
    )
    return state, request


async def _seed(conn: AsyncConnection, task_id: uuid.UUID, state: State) -> None:
    task = state.task
    retry = RETRY_POLICIES[task.retry]
    await conn.execute(
        text(
            "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at, updated_at,"
            " attempt_count, event_seq, kind, health_device_id, retry)"
            " VALUES (:id, :status, 0, :max, :ttl, CAST(:plan AS jsonb), :t, :t, :count, 7, :kind, :device,"
            " CAST(:retry AS jsonb))"
        ),
        {"id": task_id, "status": state.status.value, "max": state.max_attempts, "ttl": TTL,
         "plan": json.dumps(INFRA_PLAN if task.infra_plan else {}), "t": NOW - timedelta(minutes=5),
         "count": state.attempt_count, "kind": "health" if task.health else "user",
         "device": HOSTS["h1"] if task.health else None, "retry": json.dumps(retry) if retry else None},
    )  # fmt: skip
    if task.device_failures or task.quarantined:
        await conn.execute(
            text(
                "UPDATE devices SET infra_failures = :n, quarantined_at = CAST(:at AS timestamptz),"
                " quarantine_reason = CAST(:reason AS text)"
            ),
            {"n": task.device_failures, "at": NOW - timedelta(hours=1) if task.quarantined else None,
             "reason": "earlier" if task.quarantined else None},
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
        expected = await _core(conn, clock, ref, req)
        if req.kind == "report":
            answer: object = await leasing.report(
                conn, now, Outbox(), ref, req.outcome, req.reason, RESULTS[req.result], clock
            )  # fmt: skip
            got: object = type(answer.error) if isinstance(answer, Rejected) else answer
            if isinstance(answer, ReportReceipt):
                got = ReportKind.DUPLICATE if answer.duplicate else answer.status
        else:
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
    """Core's answer on the rows as they are (read under the task's lock, writing nothing): a claim's or renewal's
    grant, a report's duplicate or the task's status it leads to, or the class of the conflict. The store's
    locked path grants with the statement itself, so this is what keeps the statement honest where it grants."""
    await touch_host(conn, ref.host_id, await clock.now(conn))  # an unknown host: NotFound, as the store says
    task = await lock_task(conn, ref.task_id)
    named, cancel_requested = await named_attempt(conn, task, ref.attempt)
    now = await clock.now(conn)
    try:
        if req.kind != "report":
            return (decide_claim if req.kind == "claim" else decide_renew)(task, named, ref, now)
        read = text("SELECT plan FROM tasks WHERE task_id = :id")
        plan = (await conn.execute(read, {"id": ref.task_id})).scalar_one()
        cause = failure_cause(plan, RESULTS[req.result], req.reason) if req.outcome is Outcome.FAILED else None
        decision = decide_report(
            task, named, ref, req.outcome, now, cancel_requested_for_attempt=cancel_requested,
            failure=cause if task.retry is not None else None,
        )  # fmt: skip
    except Conflict as exc:
        return type(exc)
    return ReportKind.DUPLICATE if decision.kind is ReportKind.DUPLICATE else decision.task_status


async def _granted(
    conn: AsyncConnection, clock: ManualClock, ref: LeaseRef, req: Request, *, touch: bool = True
) -> object:
    db = Driver((await conn.get_raw_connection()).driver_connection)
    if req.kind == "report":
        return await grants.report(db, clock, ref, req.outcome, req.reason, RESULTS[req.result], touch=touch)
    if req.kind == "claim":
        return await grants.claim(db, clock, ref, PROGRESS[req.progress], touch=touch)
    return await grants.renew(db, clock, ref, PROGRESS[req.progress], touch=touch)


async def _signed(
    conn: AsyncConnection, clock: ManualClock, ref: LeaseRef, req: Request, *, touch: bool = True
) -> object:
    """What a refused request writes: the host's sign of life (`touch`), nothing else."""
    if touch:
        try:
            await touch_host(conn, ref.host_id, await clock.now(conn))
        except DevschedError as exc:
            return type(exc)
    return None


def _plain(state: State, req: Request) -> bool:
    """Whether the report ends its attempt and task and does nothing more (what the one statement covers)."""
    task = state.task
    if req.outcome is Outcome.CANCELLED:
        return True
    if req.outcome is Outcome.DONE:
        return not task.health
    return not task.health and RETRY_POLICIES[task.retry] is None and not task.infra_plan


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
    ) -> tuple[object, object, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any] | None]:
        """Both paths' answers and tables; without `touch`, the grant's leaves the host's sign of life out.

        Last, where the locked path granted what the grant refused, the tables of a refusal (`_signed`).
        """
        task_id = uuid.uuid4()
        ref = _ref(task_id, state, req)
        answers: list[object] = []
        tables = []
        paths: list[Callable[[AsyncConnection, ManualClock, LeaseRef, Request], Awaitable[object]]] = [
            _locked, functools.partial(_granted, touch=touch), functools.partial(_signed, touch=touch)
        ]  # fmt: skip
        for path in paths:
            if path is paths[-1] and not (isinstance(answers[0], ReportReceipt) and answers[1] is None):
                break
            async with self.store.engine.connect() as conn:
                tx = await conn.begin()
                await _seed(conn, task_id, state)
                answers.append(await path(conn, self.clock, ref, req))
                tables.append(await _tables(conn))
                await tx.rollback()
        return answers[0], answers[1], tables[0], tables[1], tables[2] if len(tables) > 2 else None

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
    _agree(agreement, data.draw(cases(kind, outcome)), touch=touch)


@pytest.mark.parametrize("outcome", list(Outcome), ids=[o.value for o in Outcome])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reports_that_need_more_than_the_statement_are_the_locked_paths(
    agreement: Any, outcome: Outcome, data: st.DataObject
) -> None:
    """Health checks, retry policies, infrastructure steps, devices that failed before: mostly granted."""
    _agree(agreement, data.draw(cases("report", outcome, needs_more=True)), touch=True)


def _agree(agreement: Any, case: tuple[State, Request], *, touch: bool) -> None:
    loop, check = agreement
    state, req = case
    locked, granted, locked_rows, granted_rows, refused_rows = loop.run_until_complete(
        check.both(state, req, touch=touch)
    )
    if not touch:
        seeded = loop.run_until_complete(check.hosts())
        assert granted_rows["hosts"] == seeded, "the hosts' rows are left as they were"
        locked_rows = {**locked_rows, "hosts": seeded}
    answered = locked.__name__ if isinstance(locked, type) else locked if locked == "duplicate" else "granted"
    plain = req.kind != "report" or _plain(state, req)
    event(f"{req.kind}: {answered}{'' if plain else ' (needs more)'}")
    if isinstance(locked, type) or locked == "duplicate":
        assert granted is None, f"core answers {locked}, the one statement granted {granted}"
    elif granted is None:
        assert not plain, f"the one statement refused a plain report the locked path granted: {locked}"
        assert granted_rows == refused_rows, "a refused report writes only the host's sign of life"
        return
    else:
        assert plain, "the one statement granted a report that needs more"
        assert granted == locked
    assert granted_rows == locked_rows
