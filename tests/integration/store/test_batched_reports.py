"""A host's reports applied together (`Store.reports`): one transaction, one commit, each answered as its own.

What the batch grants commits at once, in the order given, with each report's hand-over; what it does not
grant (a repeat, a foreign or superseded lease, a retry the locked path decides) is answered None and
changed nothing, so `report` answers it as it always did; and a batch whose transaction fails as a whole
commits none of it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest
from sqlalchemy import text

from devsched.core.errors import Conflict, InvalidRequest
from devsched.core.events import AttemptAssigned
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskStatus
from devsched.store import Committed, DatabaseTimeouts, HostReport, ManualClock, Store
from support.store_lab import Lab, kinds, ref

pytestmark = pytest.mark.integration


async def _running(lab: Lab, heard: list[Committed], n: int) -> list[LeaseRef]:
    """h1 with n devices, each running a task its submit placed there (claimed)."""
    await lab.host("h1", *(f"d{i}" for i in range(1, n + 1)))
    leases: list[LeaseRef] = []
    for _ in range(n):
        await lab.submit()
        leases += [ref(m.event) for m in heard[-1].messages if isinstance(m.event, AttemptAssigned)]
    assert len(leases) == n
    for lease in leases:
        await lab.store.claim(lease)
    heard.clear()
    return leases


async def _transactions(store: Store, task_ids: Sequence[uuid.UUID]) -> set[int]:
    """The transactions that last wrote these tasks' rows (`xmin`)."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT xmin::text::bigint FROM tasks WHERE task_id = ANY(:ids)"), {"ids": list(task_ids)}
        )
        return {r[0] for r in rows}


async def test_a_hosts_reports_commit_together_in_one_transaction(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    leases = await _running(lab, heard, 3)
    outcomes = [Outcome.DONE, Outcome.FAILED, Outcome.DONE]
    answers = await lab.store.reports("h1", [HostReport(lease, o) for lease, o in zip(leases, outcomes, strict=True)])
    assert [(a.task_id, a.status, a.duplicate) if a else None for a in answers] == [
        (lease.task_id, o.task_status, False) for lease, o in zip(leases, outcomes, strict=True)
    ]
    assert len(await _transactions(lab.store, [lease.task_id for lease in leases])) == 1, "one commit for all"
    (c,) = heard
    assert (c.operation, kinds(c)) == ("reports", ["done", "failed", "done"])
    assert [m.event.task_id for m in c.messages] == [lease.task_id for lease in leases], "in the order given"
    for lease, o in zip(leases, outcomes, strict=True):
        assert (await lab.store.get_task(lease.task_id)).status is o.task_status
        again = await lab.store.report(lease, o)  # the first answer, as for a report made alone
        assert again.duplicate


async def test_each_report_hands_its_own_device_over(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    leases = await _running(lab, heard, 2)
    waiting = [await lab.submit() for _ in range(2)]
    heard.clear()
    answers = await lab.store.reports("h1", [HostReport(lease, Outcome.DONE, take_next=True) for lease in leases])
    handed = [a.next for a in answers if a is not None]
    assert len(handed) == 2
    assert all(h is not None for h in handed)
    assert sorted(h.task_id for h in handed if h) == sorted(waiting), "each queued task handed once"
    assert [h.device_id for h in handed if h] == ["d1", "d2"]
    (c,) = heard
    assert kinds(c) == ["done", "assigned", "dispatched", "progress"] * 2, "each report's event before its hand-over's"
    for h in handed:
        assert h is not None
        assert (await lab.store.get_task(h.task_id)).status is TaskStatus.DISPATCHED


async def test_what_the_batch_does_not_grant_changes_nothing_and_is_left_to_report(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    done, foreign, repeat = await _running(lab, heard, 3)
    await lab.store.report(repeat, Outcome.DONE)
    heard.clear()
    stolen = LeaseRef(foreign.host_id, foreign.task_id, foreign.attempt, uuid.uuid4())
    answers = await lab.store.reports(
        "h1", [HostReport(done, Outcome.DONE), HostReport(stolen, Outcome.DONE), HostReport(repeat, Outcome.DONE)]
    )
    assert [a is not None for a in answers] == [True, False, False]
    assert (await lab.store.get_task(foreign.task_id)).status is TaskStatus.DISPATCHED, "untouched"
    (c,) = heard
    assert kinds(c) == ["done"], "only the granted report wrote an event"
    with pytest.raises(Conflict):
        await lab.store.report(stolen, Outcome.DONE)
    assert (await lab.store.report(repeat, Outcome.DONE)).duplicate


async def test_a_report_of_another_host_refuses_the_batch_whole(inline: tuple[Lab, list[Committed]]) -> None:
    lab, heard = inline
    mine, other = await _running(lab, heard, 2)
    theirs = LeaseRef("h2", other.task_id, other.attempt, other.lease_id)
    with pytest.raises(InvalidRequest):
        await lab.store.reports("h1", [HostReport(mine, Outcome.DONE), HostReport(theirs, Outcome.DONE)])
    assert [(await lab.store.get_task(lease.task_id)).status for lease in (mine, other)] == [TaskStatus.DISPATCHED] * 2
    assert heard == []


async def test_a_batch_that_fails_as_a_whole_commits_none_of_it(database_url: str, clock: ManualClock) -> None:
    """A report of the batch blocked past the lock timeout: the whole transaction rolls back, every answer None."""
    store = Store.connect(database_url, clock=clock, assign_inline=True, timeouts=DatabaseTimeouts(lock_s=0.2))
    heard: list[Committed] = []
    store.on_commit = heard.append
    lab = Lab(store, clock)
    try:
        first, blocked = await _running(lab, heard, 2)
        async with store.engine.connect() as holder:
            await holder.execute(text("SELECT 1 FROM tasks WHERE task_id = :id FOR UPDATE"), {"id": blocked.task_id})
            answers = await asyncio.wait_for(
                store.reports("h1", [HostReport(first, Outcome.DONE), HostReport(blocked, Outcome.DONE)]), 30
            )
            assert answers == [None, None]
            await holder.rollback()
        assert heard == []
        for lease in (first, blocked):
            assert (await store.get_task(lease.task_id)).status is TaskStatus.DISPATCHED, "the first one too"
            assert not (await store.report(lease, Outcome.DONE)).duplicate, "each then reported on its own"
    finally:
        await store.close()
