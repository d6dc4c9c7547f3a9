"""The one clock seam: lease expiry uses the database clock in production, a settable time in tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


class Clock(Protocol):
    """Where a transaction reads `now`. Read once per operation, after its row locks are taken."""

    async def now(self, conn: AsyncConnection) -> datetime:
        """The current time, for the transaction running on `conn`."""
        ...


class DatabaseClock:
    """The database's clock.

    `clock_timestamp()` rather than `now()`: `now()` is the transaction's start, which can be well before
    a lock wait ended; comparing an expiry against it could accept a lease that had already run out.
    """

    async def now(self, conn: AsyncConnection) -> datetime:
        """The database server's current time."""
        value = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
        assert isinstance(value, datetime)
        return value


class ManualClock:
    """A clock that only moves when told to, so expiry can be tested without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    async def now(self, conn: AsyncConnection) -> datetime:
        """The time last set."""
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward and return the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now

    @property
    def current(self) -> datetime:
        """The time as set, without a connection."""
        return self._now
