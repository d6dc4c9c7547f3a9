from __future__ import annotations

import asyncio

import pytest

from devsched.agent.stop import StopLevel, StopReason, StopSignal

pytestmark = pytest.mark.unit


def test_a_fresh_signal_is_not_stopped() -> None:
    stop = StopSignal()
    assert stop.reason is StopReason.NONE
    assert not stop.stopped
    assert not stop.halted
    assert stop.halt is None


def test_cancellation_stops_without_halting() -> None:
    stop = StopSignal()
    stop.request(StopReason.CANCELLED, "cancellation requested")
    assert stop.stopped
    assert not stop.halted
    assert stop.level is StopLevel.STOP
    assert stop.detail == "cancellation requested"


def test_lease_loss_halts() -> None:
    stop = StopSignal()
    stop.request(StopReason.LEASE_LOST, "why")
    assert stop.halted
    assert stop.halt == (StopReason.LEASE_LOST, "why")


def test_shutdown_stops_like_a_cancellation_until_the_kill_halts_it() -> None:
    # The lease is still held at a shutdown: teardown steps may run (not halted) until the grace is over.
    stop = StopSignal()
    stop.request(StopReason.SHUTDOWN, "agent shutting down")
    assert (stop.stopped, stop.halted, stop.level) == (True, False, StopLevel.STOP)
    assert stop.halt is None
    stop.kill("grace over")
    assert (stop.halted, stop.level, stop.halt) == (True, StopLevel.KILL, (StopReason.SHUTDOWN, "grace over"))
    assert (stop.reason, stop.detail) == (StopReason.SHUTDOWN, "agent shutting down")


def test_the_first_reason_stays_and_a_later_halt_is_recorded() -> None:
    stop = StopSignal()
    stop.request(StopReason.CANCELLED, "first")
    stop.request(StopReason.LEASE_LOST, "second")
    stop.request(StopReason.SHUTDOWN, "third")
    assert (stop.reason, stop.detail) == (StopReason.CANCELLED, "first")
    assert stop.halt == (StopReason.LEASE_LOST, "second")
    assert stop.halted


def test_a_later_cancellation_does_not_lower_a_halt() -> None:
    stop = StopSignal()
    stop.request(StopReason.LEASE_LOST)
    stop.request(StopReason.CANCELLED)
    assert stop.reason is StopReason.LEASE_LOST
    assert stop.halted


def test_stopping_for_no_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="no reason"):
        StopSignal().request(StopReason.NONE)


def test_interrupts_fire_at_their_threshold() -> None:
    stop = StopSignal()
    with (
        stop.interrupt(StopLevel.STOP) as on_stop,
        stop.interrupt(StopLevel.HALT) as on_halt,
        stop.interrupt(StopLevel.KILL) as on_kill,
    ):
        stop.request(StopReason.CANCELLED)
        assert (on_stop.is_set(), on_halt.is_set(), on_kill.is_set()) == (True, False, False)
        stop.request(StopReason.LEASE_LOST)
        assert (on_halt.is_set(), on_kill.is_set()) == (True, False)
        stop.kill()
        assert on_kill.is_set()
    with stop.interrupt(StopLevel.KILL) as late:
        assert late.is_set()


def test_kill_halts_with_shutdown_when_nothing_else_did() -> None:
    stop = StopSignal()
    stop.kill("grace over")
    assert stop.reason is StopReason.SHUTDOWN
    assert stop.level is StopLevel.KILL


async def test_wait_returns_once_stopped() -> None:
    stop = StopSignal()
    waiter = asyncio.create_task(stop.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    stop.request(StopReason.CANCELLED)
    await asyncio.wait_for(waiter, 5)
