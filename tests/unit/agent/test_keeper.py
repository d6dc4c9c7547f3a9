from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from devsched.agent.keeper import LeaseKeeper, ends_lease
from devsched.agent.lease import LeaseClock
from devsched.agent.stop import StopReason, StopSignal
from devsched.core.errors import LeaseExpired, LeaseSuperseded, NotFound, TaskTerminal, TooManyRequests, Unavailable
from devsched.core.leases import Extension
from devsched.protocol.plans import Progress
from support.polling import eventually

pytestmark = pytest.mark.unit


def grant(ttl_s: int, cancel_requested: bool = False) -> Extension:
    """A claim or renewal as the host client returns it (ttls are whole seconds, as on the wire)."""
    return Extension(datetime.now(UTC) + timedelta(seconds=ttl_s), ttl_s, cancel_requested)


class FakeScheduler:
    """Answers renewals with a fixed ttl, or with the error or hang it is told to."""

    def __init__(self, ttl_s: int = 30) -> None:
        self.ttl_s = ttl_s
        self.cancel_requested = False
        self.error: BaseException | None = None
        self.hang = False
        self.calls: list[Progress | None] = []

    async def renew(self, progress: Progress | None) -> Extension:
        self.calls.append(progress)
        if self.hang:
            await asyncio.sleep(3600)
        if self.error is not None:
            raise self.error
        return grant(self.ttl_s, self.cancel_requested)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def claimed(scheduler: FakeScheduler, stop: StopSignal, clock: LeaseClock | None = None) -> LeaseKeeper:
    keeper = LeaseKeeper(scheduler.renew, stop, clock=clock, request_timeout_s=0.2)
    keeper.granted(keeper.clock.now(), grant(scheduler.ttl_s))
    return keeper


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def start(keeper: LeaseKeeper, running: list[asyncio.Task[None]]) -> asyncio.Task[None]:
    task = asyncio.create_task(keeper.run())
    running.append(task)
    return task


@pytest.mark.parametrize(
    ("error", "ends"),
    [
        (LeaseExpired(), True),
        (LeaseSuperseded(), True),
        (TaskTerminal(), True),
        (NotFound(), True),
        (Unavailable(), False),
        (TimeoutError(), False),
        (ConnectionError(), False),
    ],
)
def test_which_errors_end_a_lease(error: Exception, ends: bool) -> None:
    assert ends_lease(error) is ends


async def test_a_granted_renewal_extends_the_local_deadline() -> None:
    now = FakeClock()
    scheduler = FakeScheduler(ttl_s=30)
    keeper = claimed(scheduler, StopSignal(), LeaseClock(clock=now))
    now.now += 20
    await keeper.renew(Progress(step="flash", index=0, of=2))
    assert keeper.clock.deadline == 1050.0
    assert keeper.renewals == 1
    assert scheduler.calls == [Progress(step="flash", index=0, of=2)]


async def test_a_pending_cancellation_in_a_reply_is_a_cancellation_stop() -> None:
    scheduler, stop = FakeScheduler(), StopSignal()
    keeper = claimed(scheduler, stop)
    scheduler.cancel_requested = True
    await keeper.renew()
    assert stop.reason is StopReason.CANCELLED
    assert not stop.halted
    assert keeper.live()


@pytest.mark.parametrize("error", [LeaseExpired(), LeaseSuperseded(), NotFound()])
async def test_a_rejected_renewal_is_a_lease_loss(error: Exception) -> None:
    scheduler, stop = FakeScheduler(), StopSignal()
    keeper = claimed(scheduler, stop)
    scheduler.error = error
    await keeper.renew()
    assert stop.reason is StopReason.LEASE_LOST
    assert stop.detail == f"renewal rejected: {getattr(error, 'code', '')}"
    assert keeper.lost
    assert not keeper.live()
    await keeper.renew()
    assert len(scheduler.calls) == 1  # no renewal after the lease is gone


async def test_a_transient_failure_is_not_a_loss() -> None:
    scheduler, stop = FakeScheduler(), StopSignal()
    keeper = claimed(scheduler, stop)
    scheduler.error = Unavailable()
    await keeper.renew()
    scheduler.hang, scheduler.error = True, None
    await asyncio.wait_for(keeper.renew(), 10)  # bounded by the request timeout
    assert stop.reason is StopReason.NONE
    assert keeper.live()


async def test_a_429_is_retried_no_sooner_than_it_asks_and_is_not_a_loss() -> None:
    now = FakeClock()
    scheduler, stop = FakeScheduler(ttl_s=30), StopSignal()
    keeper = claimed(scheduler, stop, LeaseClock(clock=now))
    scheduler.error = TooManyRequests("slow down", retry_after_s=4.0)
    await keeper.renew()
    assert stop.reason is StopReason.NONE
    assert keeper.live()
    # the backoff alone would retry within 0.1 s; the pause asked for wins
    assert keeper._next_wake(now.now) == pytest.approx(4.0)
    now.now += 4.0
    assert keeper._next_wake(now.now) == 0.0


async def test_no_renewal_is_sent_past_the_deadline() -> None:
    now = FakeClock()
    scheduler, stop = FakeScheduler(ttl_s=30), StopSignal()
    keeper = claimed(scheduler, stop, LeaseClock(clock=now))
    now.now += 30
    await keeper.renew()
    assert scheduler.calls == []
    assert stop.reason is StopReason.LEASE_LOST
    assert stop.detail == "no successful renewal within the lease ttl"


async def test_the_loop_renews_at_about_a_third_of_the_ttl(running: list[asyncio.Task[None]]) -> None:
    scheduler, stop = FakeScheduler(ttl_s=1), StopSignal()
    keeper = claimed(scheduler, stop)
    task = start(keeper, running)
    await eventually(lambda: keeper.renewals >= 3, message="three scheduled renewals")
    assert stop.reason is StopReason.NONE
    keeper.close()
    await asyncio.wait_for(task, 10)


async def test_a_nudge_renews_at_once(running: list[asyncio.Task[None]]) -> None:
    scheduler, stop = FakeScheduler(ttl_s=3600), StopSignal()
    keeper = claimed(scheduler, stop)
    start(keeper, running)
    await asyncio.sleep(0.05)
    assert keeper.renewals == 0  # nothing due for 20 minutes
    scheduler.cancel_requested = True
    keeper.nudge()
    await eventually(lambda: stop.reason is StopReason.CANCELLED, message="cancellation seen after a nudge")
    assert keeper.renewals == 1


async def test_failing_renewals_lose_the_lease_at_the_deadline(running: list[asyncio.Task[None]]) -> None:
    scheduler, stop = FakeScheduler(ttl_s=1), StopSignal()
    keeper = claimed(scheduler, stop)
    scheduler.error = Unavailable()
    task = start(keeper, running)
    await asyncio.wait_for(task, 10)  # the loop ends by itself once the lease is lost
    assert stop.reason is StopReason.LEASE_LOST
    assert stop.detail == "no successful renewal within the lease ttl"
    assert len(scheduler.calls) >= 2  # it kept retrying until then


async def test_a_rejection_ends_the_loop(running: list[asyncio.Task[None]]) -> None:
    scheduler, stop = FakeScheduler(ttl_s=1), StopSignal()
    keeper = claimed(scheduler, stop)
    scheduler.error = LeaseExpired()
    task = start(keeper, running)
    await asyncio.wait_for(task, 10)
    assert stop.detail == "renewal rejected: lease_expired"
    assert len(scheduler.calls) == 1


async def test_renewals_go_on_after_a_cancellation_for_teardown(running: list[asyncio.Task[None]]) -> None:
    scheduler, stop = FakeScheduler(ttl_s=1), StopSignal()
    scheduler.cancel_requested = True
    keeper = claimed(scheduler, stop)
    start(keeper, running)
    await eventually(lambda: keeper.renewals >= 3, message="renewals after the cancellation")
    assert stop.reason is StopReason.CANCELLED
    assert keeper.live()


async def test_progress_is_sent_until_a_renewal_carrying_it_is_granted(running: list[asyncio.Task[None]]) -> None:
    """A boundary's renewal carries its progress; scheduled renewals after its grant carry none (issue 10)."""
    scheduler = FakeScheduler(ttl_s=1)
    keeper = claimed(scheduler, StopSignal())
    second, third = Progress(step="test", index=1, of=3), Progress(step="wipe", index=2, of=3)
    await keeper.renew(second)
    start(keeper, running)
    await eventually(lambda: len(scheduler.calls) >= 3, message="scheduled renewals")
    await keeper.renew(third)
    await eventually(lambda: len(scheduler.calls) >= 6, message="scheduled renewals after the next step")
    assert [c for c in scheduler.calls if c is not None] == [second, third], scheduler.calls
    assert scheduler.calls[0] == second


async def test_a_boundary_whose_reply_was_lost_is_sent_again_with_its_progress() -> None:
    scheduler = FakeScheduler(ttl_s=30)
    keeper = claimed(scheduler, StopSignal())
    second = Progress(step="test", index=1, of=3)
    scheduler.error = TimeoutError()  # the renewal went out; its reply did not come back
    await keeper.renew(second)
    scheduler.error = None
    await keeper.renew()  # the retry (scheduled or nudged) carries it again
    await keeper.renew()
    assert scheduler.calls == [second, second, None]
