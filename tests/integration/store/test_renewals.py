"""`Store.renewals`: several leases of one host renewed at once, each answered as `renew` would answer it."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text

from devsched.core.errors import InvalidRequest, LeaseExpired, LeaseForeign, LeaseSuperseded, NotFound, TaskTerminal
from devsched.core.leases import Extension
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome
from support.store_lab import Lab, snapshot

pytestmark = pytest.mark.integration


async def _running(lab: Lab, host_id: str, count: int, **kwargs: object) -> list[LeaseRef]:
    await lab.host(host_id, *(f"{host_id}-d{i}" for i in range(1, count + 1)))
    return [await lab.running(**kwargs) for _ in range(count)]


async def _expiry(lab: Lab, lease: LeaseRef) -> object:
    async with lab.store.engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT expires_at FROM attempts WHERE task_id = :t AND attempt = :a"),
                {"t": lease.task_id, "a": lease.attempt},
            )
        ).scalar_one()


async def test_every_lease_is_extended_by_its_ttl_from_now(lab: Lab) -> None:
    leases = await _running(lab, "h1", 4, lease_ttl_s=20)
    lab.clock.advance(7)
    answers = await lab.store.renewals("h1", [(lease, None) for lease in leases])
    assert all(isinstance(a, Extension) for a in answers), answers
    for lease, answer in zip(leases, answers, strict=True):
        assert isinstance(answer, Extension)
        assert (answer.ttl_s, answer.cancel_requested, answer.stop) == (20, False, None)
        assert answer.expires_at == lab.clock.current + timedelta(seconds=20)
        assert await _expiry(lab, lease) == answer.expires_at


async def test_each_lease_gets_the_answer_renew_would_give_it(lab: Lab) -> None:
    good, expired, terminal = await _running(lab, "h1", 3, lease_ttl_s=10)
    (foreign,) = await _running(lab, "h2", 1, lease_ttl_s=10)
    await lab.store.report(terminal, Outcome.DONE)
    lab.clock.advance(5)
    assert isinstance(await lab.store.renew(good), Extension)
    lab.clock.advance(6)  # `expired` is past its expiry, `good` (renewed 6 s ago) is not
    await lab.alive()
    superseded = dataclasses.replace(good, lease_id=uuid.uuid4())
    unknown = dataclasses.replace(good, task_id=uuid.uuid4())
    named_by_h1 = dataclasses.replace(foreign, host_id="h1")
    foreign_expiry = await _expiry(lab, foreign)

    asked = [good, expired, terminal, unknown, named_by_h1]
    answers = await lab.store.renewals("h1", [(lease, None) for lease in asked])
    assert isinstance(answers[0], Extension)
    assert [type(a) for a in answers[1:]] == [LeaseExpired, TaskTerminal, NotFound, LeaseForeign]
    assert await _expiry(lab, foreign) == foreign_expiry, "another host's lease is never extended"
    # one superseded lease among granted ones: only it is refused
    (refused,) = await lab.store.renewals("h1", [(superseded, None)])
    assert isinstance(refused, LeaseSuperseded)
    assert await _expiry(lab, good) == answers[0].expires_at


async def test_progress_rides_along_and_writes_its_event(lab: Lab) -> None:
    first, second = await _running(lab, "h1", 2)
    step = {"step": "flash", "index": 0, "of": 1}
    answers = await lab.store.renewals("h1", [(first, step), (second, None)])
    assert all(isinstance(a, Extension) for a in answers), answers
    view = await lab.store.get_task(first.task_id)
    assert view.attempts[-1].progress == step
    assert (await lab.store.get_task(second.task_id)).attempts[-1].progress is None


async def test_a_lease_of_another_host_in_the_list_is_a_bad_request(lab: Lab) -> None:
    (lease,) = await _running(lab, "h1", 1)
    before = await snapshot(lab.store)
    with pytest.raises(InvalidRequest):
        await lab.store.renewals("h2", [(lease, None)])
    assert await snapshot(lab.store) == before


async def test_overlapping_lists_and_reports_at_once_never_deadlock(lab: Lab) -> None:
    leases = await _running(lab, "h1", 6)
    forward, backward = [(lease, None) for lease in leases], [(lease, None) for lease in reversed(leases)]
    for _ in range(5):
        lab.clock.advance(1)
        results = await asyncio.gather(
            lab.store.renewals("h1", forward),
            lab.store.renewals("h1", backward),
            lab.store.renew(leases[2]),
        )
        assert all(isinstance(a, Extension) for a in [*results[0], *results[1]]), results
    await lab.store.report(leases[0], Outcome.DONE)
    answers = await lab.store.renewals("h1", forward)
    assert isinstance(answers[0], TaskTerminal)
    assert all(isinstance(a, Extension) for a in answers[1:])
