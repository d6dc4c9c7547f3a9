"""The renewal batcher: coalescing, splitting, per-lease answers, whole-request failures and the fallback,
with a fake client standing in for the scheduler (pure logic: no NATS)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devsched.agent.client import renewal_answer
from devsched.agent.keeper import LeaseKeeper, ends_lease
from devsched.agent.lease import LeaseClock
from devsched.agent.renewals import RenewalBatcher
from devsched.agent.stop import StopSignal
from devsched.core.errors import (
    DevschedError,
    Internal,
    InvalidRequest,
    LeaseExpired,
    LeaseSuperseded,
    NotFound,
    OutcomeConflict,
    TaskTerminal,
    Unavailable,
)
from devsched.core.leases import Extension
from devsched.protocol import messages as m
from devsched.protocol.transport import NoReply
from support.polling import eventually

pytestmark = pytest.mark.unit

Answer = Extension | DevschedError


def grant(ttl_s: int, cancel_requested: bool = False) -> Extension:
    return Extension(datetime.now(UTC) + timedelta(seconds=ttl_s), ttl_s, cancel_requested)


def lease(attempt: int = 1, task_id: uuid.UUID | None = None, progress: m.Progress | None = None) -> m.RenewRequest:
    return m.RenewRequest(task_id=task_id or uuid.uuid4(), attempt=attempt, lease_id=uuid.uuid4(), progress=progress)


def by_attempt(request: m.RenewRequest) -> Answer:
    """A grant whose ttl names the attempt, so each caller can tell its own answer."""
    return grant(10 + request.attempt)


class FakeClient:
    """Answers `renewals` and `renew` per lease with `answer`; or fails, or holds a request until `gate` opens."""

    def __init__(self, answer: Callable[[m.RenewRequest], Answer] = by_attempt) -> None:
        self.renewals = True
        self.answer = answer
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None
        self.batches: list[list[m.RenewRequest]] = []
        self.singles: list[m.RenewRequest] = []

    async def renew_several(self, leases: Sequence[m.RenewRequest], *, timeout_s: float) -> list[Answer]:
        self.batches.append(list(leases))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [self.answer(one) for one in leases]

    async def renew(
        self, task_id: uuid.UUID, attempt: int, lease_id: uuid.UUID, progress: m.Progress | None, *, timeout_s: float
    ) -> Extension:
        request = m.RenewRequest(task_id=task_id, attempt=attempt, lease_id=lease_id, progress=progress)
        self.singles.append(request)
        answer = self.answer(request)
        if isinstance(answer, DevschedError):
            raise answer
        return answer


async def settle(results: list[asyncio.Task[Extension]]) -> list[Extension | BaseException]:
    async with asyncio.timeout(5):
        return await asyncio.gather(*results, return_exceptions=True)


def spawn(batcher: RenewalBatcher, leases: Sequence[m.RenewRequest]) -> list[asyncio.Task[Extension]]:
    return [asyncio.create_task(batcher.renew(one)) for one in leases]


async def test_renewals_of_one_loop_turn_go_in_one_request_each_answered_its_own() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1)
    leases = [lease(attempt) for attempt in range(1, 6)]
    answers = await settle(spawn(batcher, leases))
    assert client.batches == [leases]
    assert [a.ttl_s for a in answers if isinstance(a, Extension)] == [11, 12, 13, 14, 15]
    assert client.singles == []


async def test_a_lone_renewal_goes_out_at_once() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1)
    async with asyncio.timeout(0.5):  # no timer holds it back (a lone renewal takes a few loop turns)
        assert (await batcher.renew(lease(3))).ttl_s == 13
    assert len(client.batches) == 1


async def test_renewals_asked_while_one_is_in_flight_go_together_after_it() -> None:
    client = FakeClient()
    client.gate = asyncio.Event()
    batcher = RenewalBatcher(client, timeout_s=1)
    first = spawn(batcher, [lease(1)])
    await eventually(lambda: client.batches, interval=0.001, message="the first request out")
    later = [lease(attempt) for attempt in (2, 3, 4)]
    waiting = spawn(batcher, later[:1])
    await asyncio.sleep(0.01)  # in another loop turn than the rest
    waiting += spawn(batcher, later[1:])
    await asyncio.sleep(0.01)
    assert len(client.batches) == 1, "nothing more goes out while the first is in flight"
    client.gate.set()
    answers = await settle(first + waiting)
    assert [len(batch) for batch in client.batches] == [1, 3]
    assert client.batches[1] == later
    assert [a.ttl_s for a in answers if isinstance(a, Extension)] == [11, 12, 13, 14]


async def test_a_batch_is_split_at_its_largest_size() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1, max_batch=3)
    leases = [lease(attempt) for attempt in range(1, 8)]
    answers = await settle(spawn(batcher, leases))
    assert [len(batch) for batch in client.batches] == [3, 3, 1]
    assert [one for batch in client.batches for one in batch] == leases
    assert [a.ttl_s for a in answers if isinstance(a, Extension)] == [11, 12, 13, 14, 15, 16, 17]


def test_a_batch_size_beyond_the_protocols_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        RenewalBatcher(FakeClient(), timeout_s=1, max_batch=257)


async def test_each_lease_gets_its_own_error_and_only_409_and_404_end_a_lease() -> None:
    errors: dict[int, DevschedError] = {2: LeaseExpired(), 3: NotFound(), 4: Unavailable()}
    client = FakeClient(lambda request: errors.get(request.attempt) or by_attempt(request))
    batcher = RenewalBatcher(client, timeout_s=1)
    answers = await settle(spawn(batcher, [lease(attempt) for attempt in range(1, 5)]))
    assert isinstance(answers[0], Extension)
    assert answers[0].ttl_s == 11
    assert [type(a) for a in answers[1:]] == [LeaseExpired, NotFound, Unavailable]
    assert [isinstance(a, BaseException) and ends_lease(a) for a in answers] == [False, True, True, False]
    assert len(client.batches) == 1


async def test_the_same_lease_twice_waits_for_the_next_request() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1)
    task_id = uuid.uuid4()
    twice = [lease(1, task_id), lease(1, task_id), lease(2)]
    answers = await settle(spawn(batcher, twice))
    assert client.batches == [[twice[0], twice[2]], [twice[1]]]
    assert all(isinstance(a, Extension) for a in answers)


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (NoReply("no reply", subject="s", reason="timeout"), NoReply),
        (Unavailable("database down"), Unavailable),
        (Internal(), Internal),
        (OutcomeConflict(), Unavailable),  # a 409 of the whole request is no lease's: never ends one
        (ConnectionError("closed"), Unavailable),
    ],
)
async def test_a_failed_request_is_a_transient_error_for_every_caller(
    failure: BaseException, raised: type[DevschedError]
) -> None:
    client = FakeClient()
    client.fail = failure
    batcher = RenewalBatcher(client, timeout_s=1)
    answers = await settle(spawn(batcher, [lease(1), lease(2)]))
    assert [type(a) for a in answers] == [raised, raised]
    assert not any(isinstance(a, BaseException) and ends_lease(a) for a in answers)
    assert answers[0] is not answers[1], "each caller raises its own"
    assert client.renewals is True, "still served: the next renewals go in batches again"
    assert client.singles == []


@pytest.mark.parametrize(
    "failure",
    [NoReply("no reply", subject="s", reason="no_responders"), NotFound(), InvalidRequest()],
)
async def test_an_unserved_request_falls_back_to_one_renew_per_lease(failure: BaseException) -> None:
    client = FakeClient(lambda request: LeaseSuperseded() if request.attempt == 2 else by_attempt(request))
    client.fail = failure
    batcher = RenewalBatcher(client, timeout_s=1)
    leases = [lease(1), lease(2)]
    answers = await settle(spawn(batcher, leases))
    assert isinstance(answers[0], Extension)
    assert answers[0].ttl_s == 11
    assert isinstance(answers[1], LeaseSuperseded)
    assert client.singles == leases
    assert client.renewals is False, "until a register or heartbeat reply says renewals again"
    await settle(spawn(batcher, [lease(3)]))
    assert (len(client.batches), len(client.singles)) == (1, 3)


async def test_without_renewals_each_lease_is_renewed_alone() -> None:
    client = FakeClient()
    client.renewals = False
    batcher = RenewalBatcher(client, timeout_s=1)
    progress = m.Progress(step="flash", index=0, of=2)
    leases = [lease(1, progress=progress), lease(2)]
    answers = await settle(spawn(batcher, leases))
    assert client.batches == []
    assert client.singles == leases
    assert [a.ttl_s for a in answers if isinstance(a, Extension)] == [11, 12]


async def test_a_caller_that_gave_up_is_left_out() -> None:
    client = FakeClient()
    client.gate = asyncio.Event()
    batcher = RenewalBatcher(client, timeout_s=1)
    first = spawn(batcher, [lease(1)])
    await eventually(lambda: client.batches, interval=0.001, message="the first request out")
    gone, kept = spawn(batcher, [lease(2), lease(3)])
    await asyncio.sleep(0)
    gone.cancel()
    client.gate.set()
    answers = await settle([*first, kept])
    assert [a.ttl_s for a in answers if isinstance(a, Extension)] == [11, 13]
    assert [[one.attempt for one in batch] for batch in client.batches] == [[1], [3]]


class Joiner:
    """A member that, asked to join, renews its own lease in its own task (as a keeper's loop does)."""

    def __init__(self, batcher: RenewalBatcher, attempt: int, due: bool) -> None:
        self.batcher, self.lease, self.due = batcher, lease(attempt), due
        self.tasks: list[asyncio.Task[Extension]] = []

    def join(self) -> bool:
        if self.due:
            self.tasks.append(asyncio.create_task(self.batcher.renew(self.lease)))
        return self.due


async def test_members_due_soon_ride_along_with_a_batch() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1)
    members = [Joiner(batcher, attempt, due=attempt != 3) for attempt in (2, 3, 4)]
    for member in members:
        batcher.enter(member)
    batcher.leave(members[2])
    await settle(spawn(batcher, [lease(1)]))
    assert [[one.attempt for one in batch] for batch in client.batches] == [[1, 2]]
    await settle(members[0].tasks)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("elapsed", "joins"), [(0.2, False), (0.6, True), (1.5, True)])
def test_a_keeper_joins_when_its_renewal_is_due_within_half_an_interval(elapsed: float, joins: bool) -> None:
    clock = FakeClock()

    async def never(progress: m.Progress | None) -> Extension:
        raise AssertionError("not called")

    keeper = LeaseKeeper(never, StopSignal(), clock=LeaseClock(clock=clock))
    keeper.granted(clock.now, grant(3))  # a renewal due every second
    clock.now += elapsed
    assert keeper.join() is joins
    assert keeper.join() is False, "asked once: it is already renewing"


def test_a_keeper_without_a_grant_or_after_its_end_does_not_join() -> None:
    async def never(progress: m.Progress | None) -> Extension:
        raise AssertionError("not called")

    keeper = LeaseKeeper(never, StopSignal())
    assert keeper.join() is False
    keeper.granted(keeper.clock.now() - 2, grant(3))
    keeper.close()
    assert keeper.join() is False


async def test_keepers_share_one_request_and_carry_their_own_progress() -> None:
    client = FakeClient()
    batcher = RenewalBatcher(client, timeout_s=1)
    leases = [lease(attempt) for attempt in (1, 2)]
    keepers = []
    for one in leases:

        async def call(progress: m.Progress | None, one: m.RenewRequest = one) -> Extension:
            return await batcher.renew(one.model_copy(update={"progress": progress}))

        keepers.append(LeaseKeeper(call, StopSignal(), group=batcher))
        keepers[-1].granted(keepers[-1].clock.now() - 0.8, grant(3))  # due in 0.2 s: within half an interval
    running = [asyncio.create_task(keeper.run()) for keeper in keepers]
    try:
        progress = m.Progress(step="flash", index=1, of=2)
        await asyncio.sleep(0)  # both loops running and registered
        await keepers[0].renew(progress)  # a step boundary: at once, and the other keeper joins it
        assert [(one.attempt, one.progress) for one in client.batches[0]] == [(1, progress), (2, None)]
        await eventually(lambda: keepers[1].renewals == 1, message="the joining keeper's grant applied")
        assert keepers[1].clock.until_renewal() > 0.5, "its schedule moved with the grant"
    finally:
        for keeper in keepers:
            keeper.close()
        await asyncio.gather(*running)


def outcome(**fields: Any) -> m.RenewalOutcome:
    return m.RenewalOutcome.model_validate({"task_id": uuid.uuid4(), "attempt": 2, "lease_id": uuid.uuid4(), **fields})


def test_an_outcome_is_the_grant_or_the_error_renew_would_raise() -> None:
    expires = datetime.now(UTC)
    granted = renewal_answer(outcome(expires_at=expires, ttl_s=30, cancel_requested=True))
    assert granted == Extension(expires, 30, True)
    error = {"code": "task_terminal", "message": "the task ended", "details": {"status": "failed"}}
    refused = renewal_answer(outcome(error=error))
    assert isinstance(refused, TaskTerminal)
    assert (refused.message, refused.details) == ("the task ended", {"status": "failed"})
    unknown = renewal_answer(outcome(error={"code": "brand_new", "message": "?"}))
    assert type(unknown) is Internal
    assert not ends_lease(unknown)
    assert isinstance(renewal_answer(outcome()), Internal), "neither grant nor error"
