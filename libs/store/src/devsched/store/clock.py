"""The one clock seam: lease expiry uses the database clock in production, a settable time in tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

#: The current time inside one SQL statement, with `{CLOCK_PARAM: clock.bound()}` among its parameters:
#: the bound time of a clock a test sets, else the database's `clock_timestamp()`. That is evaluated
#: where it is used, so a statement that waited for a row lock judges an expiry by the time after the
#: wait (Postgres re-evaluates the conditions of a row it waited for); each use reads the clock anew.
NOW = "COALESCE(CAST(:clock_now AS timestamptz), clock_timestamp())"
#: The parameter of `NOW`.
CLOCK_PARAM = "clock_now"


class Clock(Protocol):
    """Where a transaction reads `now`: as its first statement, and again after its row locks.

    Operations that judge a lease (claim, renew, report, sweep) or stamp a device's attempt (assign)
    read it again once their locks are held, so a wait for a lock never makes an expired lease look
    live, and timestamps of one device's attempts never overlap. A statement that needs the time and
    nothing else from a round trip of its own reads it inline instead: `NOW`, with `bound()`.
    """

    async def now(self, conn: AsyncConnection) -> datetime:
        """The current time, for the transaction running on `conn`."""
        ...

    def bound(self) -> datetime | None:
        """The value of `NOW`'s parameter: a time to use, or None for the database's clock."""
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

    def bound(self) -> None:
        """None: `NOW` reads `clock_timestamp()` in the statement itself."""
        return None


class ManualClock:
    """A clock that only moves when told to, so expiry can be tested without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    async def now(self, conn: AsyncConnection) -> datetime:
        """The time last set."""
        return self._now

    def bound(self) -> datetime:
        """The time last set, for `NOW`."""
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward and return the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now

    @property
    def current(self) -> datetime:
        """The time as set, without a connection."""
        return self._now
