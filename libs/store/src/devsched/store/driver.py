"""Statements run through asyncpg itself, on a connection of the engine's pool.

For the one-statement operations of the request path (`devsched.store.grants`, submit): SQLAlchemy's
execution (compiling, the execution context, the result, the hop between greenlets) costs several times
what asyncpg spends on such a statement. The statements are the same `text()` objects, rendered once in
asyncpg's form; the connections are the pool's, with its settings, TLS and timeouts. Outside a
transaction block each statement commits on its own. `Transactor.statements` lends the connection and
turns the driver's errors into `DevschedError`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeAlias

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import TextClause, text
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]

#: A row as asyncpg returns it (an `asyncpg.Record`): columns by name, `row["expires_at"]`.
Row: TypeAlias = Mapping[str, Any]


class Sql:
    """A statement with `:name` parameters (as `text()` takes) in asyncpg's form: `$n`, and their names."""

    __slots__ = ("names", "text")

    def __init__(self, statement: str | TextClause) -> None:
        compiled = (text(statement) if isinstance(statement, str) else statement).compile(dialect=_DIALECT)
        self.text: str = compiled.string
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ())

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for `params` (every name the statement uses must be there)."""
        return [params[name] for name in self.names]


class Driver:
    """One pooled connection, for statements that each commit on their own."""

    __slots__ = ("_connection",)

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection

    async def row(self, sql: Sql, params: Mapping[str, Any]) -> Row | None:
        """The first row `sql` returns, or None."""
        row: Row | None = await self._connection.fetchrow(sql.text, *sql.args(params))
        return row

    async def rows(self, sql: Sql, params: Mapping[str, Any]) -> list[Row]:
        """Every row `sql` returns."""
        rows: list[Row] = await self._connection.fetch(sql.text, *sql.args(params))
        return rows

    def transaction(self) -> AbstractAsyncContextManager[object]:
        """A transaction block (`async with`): its statements commit together at its end, or none does.

        For statements that must commit as one (a report and the assignment of the device it frees) without
        the SQLAlchemy transaction around them.
        """
        block: AbstractAsyncContextManager[object] = self._connection.transaction()
        return block

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (the server closed it, or the network)."""
        return bool(self._connection.is_closed())


async def in_transaction(conn: AsyncConnection) -> Driver:
    """A driver over the connection of `conn`'s transaction, so its statements are part of that transaction.

    For a one-statement operation that shares a transaction with more work (a submit or report that also
    assigns, `Store.assign_inline`). SQLAlchemy begins the transaction with its first statement; one that
    ran none yet (a test's clock reads no time) is made to begin it first.
    """
    raw = (await conn.get_raw_connection()).driver_connection
    assert raw is not None, "a connection of an open transaction"
    if not raw.is_in_transaction():
        await conn.execute(text("SELECT 1"))
    return Driver(raw)
