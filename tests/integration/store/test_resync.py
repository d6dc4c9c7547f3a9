"""The resync's read: exactly the attempts assigned and not claimed whose lease still runs, by host and by age."""

from __future__ import annotations

import uuid

import pytest

from devsched.core.events import AttemptAssigned
from devsched.core.status import Outcome
from devsched.store import ManualClock, Store, Unclaimed
from devsched.store.outbox import trace_headers
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _assigned(lab: Lab, device_id: str, **fields: object) -> AttemptAssigned:
    """Submit a task for `device_id` and assign it; the assignment as the outbox recorded it."""
    task_id = await lab.submit(device_id=device_id, **fields)
    (assigned,) = [m for m in await lab.store.assign() if m.task_id == task_id]
    return assigned


def _tasks(rows: list[Unclaimed]) -> list[uuid.UUID]:
    return [r.assignment.task_id for r in rows]


async def test_only_assigned_unclaimed_unexpired_attempts_are_read_back_as_they_were_assigned(
    lab: Lab, store: Store, clock: ManualClock
) -> None:
    await lab.host("h1", "h1-a", "h1-b", "h1-c", "h1-d", "h1-e")
    token = trace_headers.set({"traceparent": TRACEPARENT})
    try:
        waiting = await _assigned(lab, "h1-a", lease_ttl_s=600)
    finally:
        trace_headers.reset(token)
    claimed = await _assigned(lab, "h1-b", lease_ttl_s=600)
    await store.claim(ref(claimed))
    ended = await _assigned(lab, "h1-c", lease_ttl_s=600)
    await store.claim(ref(ended))
    await store.report(ref(ended), Outcome.DONE)
    released = await _assigned(lab, "h1-d", lease_ttl_s=600)
    clock.advance(1)
    expiring = await _assigned(lab, "h1-e", lease_ttl_s=5)
    await store.release(ref(released), reason="test")  # queued again (no assignment pass follows here)

    rows = await store.unclaimed_assignments()
    assert _tasks(rows) == [waiting.task_id, expiring.task_id]
    first = rows[0]
    assert first.assignment == waiting  # the value the relay published: plan, ttl, expiry, lease
    assert first.headers == {"traceparent": TRACEPARENT}
    assert rows[1].headers == {}

    clock.advance(6)  # past the short lease's expiry, not yet swept: its attempt is no longer the host's
    assert _tasks(await store.unclaimed_assignments()) == [waiting.task_id]
    await store.sweep_expired()
    assert _tasks(await store.unclaimed_assignments()) == [waiting.task_id]


async def test_one_hosts_attempts_or_those_old_enough_on_online_hosts(
    lab: Lab, store: Store, clock: ManualClock
) -> None:
    await lab.host("h1", "h1-a", "h1-b")
    await lab.host("h2", "h2-a")
    await lab.host("h3", "h3-a")
    old_h1 = await _assigned(lab, "h1-a", lease_ttl_s=600)
    old_h3 = await _assigned(lab, "h3-a", lease_ttl_s=600)
    clock.advance(20)  # h3 sends nothing from here on: offline after three missed heartbeats (15 s)
    await store.heartbeat("h1")
    await store.heartbeat("h2")
    new_h1 = await _assigned(lab, "h1-b", lease_ttl_s=600)
    new_h2 = await _assigned(lab, "h2-a", lease_ttl_s=600)

    assert _tasks(await store.unclaimed_assignments(host_id="h1")) == [old_h1.task_id, new_h1.task_id]
    assert _tasks(await store.unclaimed_assignments(host_id="h2")) == [new_h2.task_id]
    assert _tasks(await store.unclaimed_assignments(host_id="h3")) == [old_h3.task_id]
    assert set(_tasks(await store.unclaimed_assignments(older_than_s=10))) == {old_h1.task_id, old_h3.task_id}
    assert _tasks(await store.unclaimed_assignments(older_than_s=10, online=True)) == [old_h1.task_id]
    online = _tasks(await store.unclaimed_assignments(online=True))
    assert online[0] == old_h1.task_id  # oldest first
    assert set(online[1:]) == {new_h1.task_id, new_h2.task_id}
    assert await store.unclaimed_assignments(older_than_s=30) == []


async def test_pages_continue_after_the_last_row(lab: Lab, store: Store) -> None:
    await lab.host("h1", *(f"h1-{n}" for n in range(5)))
    assigned = [await _assigned(lab, f"h1-{n}", lease_ttl_s=600) for n in range(5)]  # one time: by task id
    pages: list[list[Unclaimed]] = []
    after: Unclaimed | None = None
    while page := await store.unclaimed_assignments(after=after, limit=2):
        pages.append(page)
        after = page[-1]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(r.assignment.task_id for p in pages for r in p) == sorted(a.task_id for a in assigned)
