"""The statements a Store sends, through SQLAlchemy and through asyncpg itself: to count what an operation costs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event as sa_event

from devsched.store import Store


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The statements `store` sends meanwhile, through SQLAlchemy and through asyncpg itself.

    SQLAlchemy's own are heard before it executes them; asyncpg's query loggers hear the driver's
    statements and every BEGIN and COMMIT (they are called soon after each statement: `await logged()`
    before reading). Only connections checked out of the pool meanwhile are heard.
    """
    sent: list[str] = []
    hooked: list[Any] = []

    def heard(record: Any) -> None:
        sent.append(record.query)

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        record.driver_connection.add_query_logger(heard)
        hooked.append(record.driver_connection)

    def executed(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    engine = store.engine.sync_engine
    sa_event.listen(engine, "checkout", checkout)
    sa_event.listen(engine, "before_cursor_execute", executed)
    try:
        yield sent
    finally:
        sa_event.remove(engine, "checkout", checkout)
        sa_event.remove(engine, "before_cursor_execute", executed)
        for raw in hooked:
            raw.remove_query_logger(heard)


async def logged() -> None:
    """Let the query loggers run (asyncpg calls them with `call_soon`)."""
    for _ in range(3):
        await asyncio.sleep(0)
