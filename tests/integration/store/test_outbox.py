"""The outbox's two ways out: messages handed to their process after the commit (published at once, marked
later by a relay pass), and the relay's pass over the table, which leaves alone what a process is publishing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import text

from devsched.store import Committed, OutboxMessage, Published
from support.outbox_rows import Publisher
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def sent(lab: Lab) -> dict[int, bool]:
    async with lab.store.engine.connect() as conn:
        rows = (
            await conn.execute(text("SELECT id, id NOT IN (SELECT id FROM outbox_unsent) AS sent FROM outbox"))
        ).all()
    return {r.id: r.sent for r in rows}


async def test_the_messages_heard_after_a_commit_are_its_rows(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.host("h1", "d1")
    task_id = await lab.submit()
    await lab.store.assign()
    publisher = Publisher()
    assert await lab.store.relay_outbox(publisher) == 3
    by_id = {m.id: m for m in publisher.got}
    told = [m for c in heard for m in c.messages]
    assert [m.id for m in told] == sorted(by_id), "ids in commit order"
    for m in told:
        assert m == by_id[m.id], "the event and headers heard are the row's"
    assert told[0].event.task_id == task_id


async def test_a_pass_marks_what_was_published_at_once_and_skips_what_is_in_flight(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    for _ in range(3):
        await lab.submit()
    published_at_once, in_flight, left = (c.messages[0].id for c in heard)
    publisher = Publisher()
    assert await lab.store.relay_outbox(publisher, mark=[published_at_once], skip=[in_flight]) == 1
    assert [m.id for m in publisher.got] == [left], "neither the marked nor the in-flight one is published again"
    assert await sent(lab) == {published_at_once: True, in_flight: False, left: True}


async def test_a_routine_pass_leaves_young_messages_to_their_writer(lab: Lab) -> None:
    await lab.submit()
    publisher = Publisher()
    assert await lab.store.relay_outbox(publisher, older_than_s=3) == 0
    lab.clock.advance(2)
    assert await lab.store.relay_outbox(publisher, older_than_s=3) == 0
    lab.clock.advance(1)
    assert await lab.store.relay_outbox(publisher, older_than_s=3) == 1
    assert await lab.store.unsent_count() == 0


async def test_a_mark_that_rolls_back_leaves_the_message_unsent(lab: Lab) -> None:
    heard: list[Committed] = []
    lab.store.on_commit = heard.append
    await lab.submit()
    await lab.submit()
    (first,), (second,) = (c.messages for c in heard)

    async def confused(batch: Sequence[OutboxMessage]) -> Published:
        return Published([10**9])

    with pytest.raises(ValueError, match="not claimed"):
        await lab.store.relay_outbox(confused, mark=[first.id])
    assert await sent(lab) == {first.id: False, second.id: False}, "the pass rolled back, its marks too"
