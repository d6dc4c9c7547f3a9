"""The one clock seam: lease expiry uses the database clock in production, a settable time in tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


class Clock(Protocol):
    """Where a transaction reads `now`: as its first statement, and again after its row locks.

    Operations that judge a lease (claim, renew, report, sweep) or stamp a device's attempt (assign)
    read it again once their locks are held, so a wait for a lock never makes an expired lease look
    live, and timestamps of one device's attempts never overlap.
    """

    async def now(self, conn: AsyncConnection) -> datetime:
        """The current time, for the transaction running on `conn`."""
        ...


class DatabaseClock:
    """The database's clock.

    `clock_timestamp()`, the server's wall clock, so every replica of every service shares one clock and
    no agent's or scheduler's clock ever decides an expiry.
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
