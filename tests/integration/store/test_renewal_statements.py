"""Each renewal is one statement: without progress the lock-free one, with progress the locked advance.

A step boundary (progress the attempt does not hold yet) is one statement that extends the lease, keeps
the step and writes its `progress` event; a periodic renewal (no progress) one that only extends; the
progress of an older agent repeated on its periodic renewals one too (the locked one), writing nothing.
A periodic renewal records the host's sign of life only when it is due (`liveness.RecentSigns`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from devsched.core.events import TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.status import EventKind
from devsched.store import Committed
from devsched.store.liveness import RECENT_S
from support.sql_log import logged, statements
from support.store_lab import Lab

pytestmark = pytest.mark.integration

FIRST = {"step": "flash", "index": 0, "of": 2}
SECOND = {"step": "test", "index": 1, "of": 2}


async def _dispatched(lab: Lab) -> LeaseRef:
    await lab.host("h1", "d1")
    lease = await lab.assign_one(await lab.submit())
    await lab.store.claim(lease, FIRST)
    return lease


async def _renewed(lab: Lab, lease: LeaseRef, progress: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """The statements one renewal sent, and the kinds of the events it wrote."""
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    lab.clock.advance(1)
    with statements(lab.store) as sent:
        await lab.store.renew(lease, progress)
        await logged()
    lab.store.on_commit = None
    return sent, [m.event.event.value for c in heard for m in c.messages if isinstance(m.event, TaskEvent)]


async def test_a_step_boundary_is_one_statement(lab: Lab) -> None:
    lease = await _dispatched(lab)
    sent, events = await _renewed(lab, lease, SECOND)
    assert len(sent) == 1, sent
    assert "FOR UPDATE" in sent[0], "the locked advance"
    assert events == [EventKind.PROGRESS.value]
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].progress is not None


async def test_a_periodic_renewal_is_one_lock_free_statement(lab: Lab) -> None:
    lease = await _dispatched(lab)
    before = (await lab.store.get_task(lease.task_id)).attempts[-1].expires_at
    sent, events = await _renewed(lab, lease, None)
    assert len(sent) == 1, sent
    assert "FOR UPDATE" not in sent[0]
    assert events == []
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].expires_at > before


async def test_an_older_agents_repeated_progress_is_one_statement_and_no_event(lab: Lab) -> None:
    lease = await _dispatched(lab)
    before = await lab.store.get_task(lease.task_id)
    sent, events = await _renewed(lab, lease, FIRST)  # what it sent with the claim, sent again
    assert len(sent) == 1, sent
    assert events == []
    after = await lab.store.get_task(lease.task_id)
    assert after.attempts[-1].expires_at > before.attempts[-1].expires_at
    assert after.attempts[-1].progress == before.attempts[-1].progress


async def _renew_now(lab: Lab, lease: LeaseRef, after_s: float) -> str:
    """The one statement of a periodic renewal `after_s` seconds on."""
    lab.clock.advance(after_s)
    with statements(lab.store) as sent:
        await lab.store.renew(lease)
        await logged()
    assert len(sent) == 1, sent
    return sent[0]


async def test_a_renewal_right_after_one_that_recorded_the_sign_of_life_leaves_it_out(lab: Lab) -> None:
    lease = await _dispatched(lab)
    assert "UPDATE hosts" in await _renew_now(lab, lease, 2), "the first renewal records the host's sign of life"
    assert "UPDATE hosts" not in await _renew_now(lab, lease, RECENT_S / 2), "recorded a moment ago"
    assert "UPDATE hosts" in await _renew_now(lab, lease, RECENT_S / 2), "due again"
    (host,) = await lab.store.list_hosts()
    assert host.last_seen_at == lab.clock.current - timedelta(seconds=RECENT_S), "written at most once a second"
    await _renew_now(lab, lease, 1)
    (host,) = await lab.store.list_hosts()
    assert host.last_seen_at == lab.clock.current


async def test_renewals_of_one_hosts_devices_at_once_record_its_sign_of_life_in_one_statement(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2", "d3", "d4")
    leases = [await lab.assign_one(await lab.submit()) for _ in range(4)]
    for lease in leases:
        await lab.store.claim(lease, FIRST)
    lab.clock.advance(2)
    with statements(lab.store) as sent:
        # real concurrency: each renewal on a connection of its own, all begun before any commits
        await asyncio.gather(*(lab.store.renew(lease) for lease in leases))
        await logged()
    renewals = [s for s in sent if "UPDATE attempts" in s]
    assert len(renewals) == 4, sent
    assert sum("UPDATE hosts" in s for s in renewals) == 1, "the others leave it out, not waiting on its row lock"
    (host,) = await lab.store.list_hosts()
    assert host.last_seen_at == lab.clock.current
