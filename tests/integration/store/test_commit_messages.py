"""The one-statement grants (claim, renew, report, submit) and the release tell `on_commit` the outbox rows they
committed, ids and all, so the scheduler publishes them at once like every other write (not a relay pass later);
with `assign_inline`, a granted report records and hands its device on in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import text

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.core.status import Outcome, TaskStatus
from devsched.store import Committed, OutboxMessage
from support.outbox_rows import FORGET_PUBLISHED, Publisher
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

STEP = {"step": "flash", "index": 0, "of": 1}


def kinds(messages: Sequence[OutboxMessage]) -> list[str]:
    return [m.event.event.value if isinstance(m.event, TaskEvent) else "assignment" for m in messages]


async def rows(lab: Lab) -> dict[int, OutboxMessage]:
    """Every outbox row as the relay reads it."""
    async with lab.store.engine.begin() as conn:
        await conn.execute(text(FORGET_PUBLISHED))
    publisher = Publisher()
    await lab.store.relay_outbox(publisher, limit=1000)
    return {m.id: m for m in publisher.got}


async def test_granted_lease_requests_hand_over_the_rows_they_inserted(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1")
    lease = await lab.running()  # submit (statement), assign, claim (statement)
    await lab.store.renew(lease)  # no event: nothing to hear
    await lab.store.renew(lease, progress=STEP)
    await lab.store.report(lease, Outcome.DONE)
    by_operation = {c.operation: c for c in heard}
    assert [c.operation for c in heard] == ["register", "submit", "assign", "claim", "renew", "report"]
    assert kinds(by_operation["submit"].messages) == ["submitted"]
    assert kinds(by_operation["claim"].messages) == ["dispatched"]
    assert kinds(by_operation["renew"].messages) == ["progress"]
    assert kinds(by_operation["report"].messages) == ["done"]
    assert (by_operation["submit"].assignable, by_operation["report"].assignable) == (True, True)
    table = await rows(lab)
    told = [m for c in heard for m in c.messages]
    assert [m.id for m in told] == sorted(table), "every row heard once, in commit order"
    for m in told:
        assert m == table[m.id], "the event and headers heard are the row's, with what the statement filled in"


async def test_a_granted_report_hands_its_device_on_in_its_own_transaction(
    inline: tuple[Lab, list[Committed]],
) -> None:
    lab, heard = inline
    await lab.host("h1", "d1")
    first = await lab.submit()
    (_, c) = heard[-2:]
    (assigned,) = [m.event for m in c.messages if isinstance(m.event, AttemptAssigned)]
    await lab.store.claim(ref(assigned))
    second = await lab.submit()  # waits for d1
    heard.clear()
    receipt = await lab.store.report(ref(assigned), Outcome.DONE)
    assert (receipt.task_id, receipt.status, receipt.duplicate) == (first, TaskStatus.DONE, False)
    (c,) = heard
    assert (c.operation, kinds(c.messages), c.assignable) == ("report", ["done", "assigned", "assignment"], False)
    assert (await lab.store.get_task(second)).status is TaskStatus.ASSIGNED
    table = await rows(lab)
    for m in c.messages:
        assert m == table[m.id]
    again = await lab.store.report(ref(assigned), Outcome.DONE)  # the locked path answers a repeat
    assert again.duplicate


async def test_a_release_is_heard_with_its_event_and_leaves_the_device_to_the_loop(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1")
    lease = await lab.running()
    heard.clear()
    await lab.store.release(lease, reason="draining")
    (c,) = heard
    assert (c.operation, c.assignable) == ("release", True)
    assert kinds(c.messages) == ["requeued"]
    table = await rows(lab)
    for m in c.messages:
        assert m == table[m.id]
    (again,) = await lab.store.assign()  # the loop, woken by `assignable`, places the task again
    assert (again.task_id, again.device_id, again.attempt) == (lease.task_id, "d1", 2)
