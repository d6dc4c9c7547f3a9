"""A commit whose answer is lost: the store says the outcome is unknown, never that nothing changed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import make_url

from devsched.core.errors import Unavailable
from devsched.core.status import TaskStatus
from devsched.store import ManualClock, NewTask, Store
from support.fault_lab import with_port
from support.polling import eventually
from support.servers import PostgresHandle
from support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

PLAN = {"steps": [{"name": "a", "action": "noop"}]}


@pytest.fixture
async def pg_proxy(postgres_server: PostgresHandle) -> AsyncIterator[TcpProxy]:
    url = make_url(postgres_server.url())
    async with TcpProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        yield proxy


async def test_a_lost_commit_answer_is_unavailable_with_an_unknown_outcome_and_the_change_may_be_there(
    pg_proxy: TcpProxy, database_url: str, store: Store
) -> None:
    task = await store.submit(NewTask(plan=PLAN, idempotency_key=f"k-{uuid.uuid4()}"))
    # Every statement carries its SQL (no statement cache), so the proxy can tell the cancel's transaction.
    proxied = Store.connect(
        with_port(database_url, pg_proxy.port) + "?prepared_statement_cache_size=0", clock=ManualClock()
    )
    try:
        pg_proxy.mute_after_commit(rb"UPDATE\s+tasks")  # a queued task's cancel ends it: UPDATE tasks, COMMIT
        cancelling = asyncio.create_task(proxied.request_cancel(task.task_id, "lost answer"))
        await eventually(lambda: pg_proxy.counts["muted_commits"] == 1, timeout=15, message="the cancel commits")
        pg_proxy.heal()  # the silent connection is reset, as the peer's kernel would
        with pytest.raises(Unavailable) as raised:
            await asyncio.wait_for(cancelling, timeout=30)
    finally:
        await proxied.close()
    assert raised.value.details.get("outcome") == "unknown"
    assert "may have been applied" in raised.value.message
    # And indeed it was: the change committed although its answer never came back.
    assert (await store.get_task(task.task_id)).status is TaskStatus.CANCELLED


async def test_an_unreachable_database_before_anything_was_sent_says_nothing_of_an_unknown_outcome(
    pg_proxy: TcpProxy, database_url: str
) -> None:
    proxied = Store.connect(with_port(database_url, pg_proxy.port), clock=ManualClock())
    try:
        await pg_proxy.close()  # nothing listens there any more
        with pytest.raises(Unavailable) as raised:
            await proxied.request_cancel(uuid.uuid4())
    finally:
        await proxied.close()
    assert "outcome" not in raised.value.details
