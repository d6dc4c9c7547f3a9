"""Engine setup: every connection carries statement, lock and idle-in-transaction timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


@dataclass(frozen=True, slots=True)
class DatabaseTimeouts:
    """Server-side limits, so a stuck query or a forgotten transaction cannot hold locks forever."""

    statement_s: float = 10.0
    lock_s: float = 5.0
    idle_in_transaction_s: float = 30.0
    connect_s: float = 5.0


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def make_engine(
    url: str,
    *,
    timeouts: DatabaseTimeouts | None = None,
    pool_size: int = 10,
    max_overflow: int = 10,
    application_name: str = "devsched",
) -> AsyncEngine:
    """An asyncpg engine for `url` (`postgresql+asyncpg://...`).

    No `pool_pre_ping` (a round trip per checkout): the Transactor instead retries an operation whose
    connection turns out dead on its first statement, before anything can have been applied.
    """
    t = timeouts or DatabaseTimeouts()
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=1800,
        connect_args={
            "timeout": t.connect_s,
            "command_timeout": t.statement_s + 5,
            "server_settings": {
                "application_name": application_name,
                "statement_timeout": _ms(t.statement_s),
                "lock_timeout": _ms(t.lock_s),
                "idle_in_transaction_session_timeout": _ms(t.idle_in_transaction_s),
                "timezone": "UTC",
            },
        },
    )
