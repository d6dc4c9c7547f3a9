"""What a service's readiness asks of the database: does it answer, and is its schema this release's.

Both run as the service's own role on its pool: `SELECT 1`, and the migration recorded in
`alembic_version`, which the service roles may read (`roles.GRANTS`) and nothing more. The failures are
`DatabaseNotReady` with one line fit for a probe's body: the driver's own message (a wrong password,
a refused connection), never the URL nor the SQL.
"""

from __future__ import annotations

from functools import lru_cache

import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

#: Postgres's "undefined_table": a database that was never migrated.
_UNDEFINED_TABLE = "42P01"


class DatabaseNotReady(Exception):
    """The database does not answer, or its schema is not the one this release expects."""


def _root(exc: BaseException) -> BaseException:
    """The driver's error behind SQLAlchemy's wrappers (asyncpg's, or the OSError of a refused connection)."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        return exc.orig.__cause__ or exc.orig
    return exc


def _why(exc: BaseException) -> str:
    root = _root(exc)
    if isinstance(root, OSError) and root.strerror:
        return f"{type(root).__name__}: {root.strerror}"
    message = str(root).strip().splitlines()[0] if str(root).strip() else ""
    return f"{type(root).__name__}: {message}" if message else type(root).__name__


def _sqlstate(exc: BaseException) -> str | None:
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        for candidate in (exc.orig, getattr(exc.orig, "__cause__", None)):
            if state := getattr(candidate, "sqlstate", None):
                return str(state)
    return None


@lru_cache(maxsize=1)
def expected_revision() -> str:
    """The newest migration of this release (alembic's head of `devsched.store.migrations`)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from devsched.store.migrations import SCRIPT_LOCATION

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError("devsched.store.migrations has no migrations")
    return head


async def ping(engine: AsyncEngine) -> None:
    """`SELECT 1` on a pooled connection.

    Raises:
        DatabaseNotReady: the database did not answer; the driver's reason.
    """
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
        raise DatabaseNotReady(_why(exc)) from None


async def schema_revision(engine: AsyncEngine) -> str | None:
    """The migration the database is at (`alembic_version`); None when it was never migrated.

    Raises:
        DatabaseNotReady: the database did not answer, or the role may not read `alembic_version`.
    """
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one_or_none()
    except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
        if _sqlstate(exc) == _UNDEFINED_TABLE:
            return None
        raise DatabaseNotReady(f"cannot read alembic_version: {_why(exc)}") from None


async def check_schema(engine: AsyncEngine) -> None:
    """Return when the database is at this release's migration.

    Raises:
        DatabaseNotReady: it is at another one (the migration Job has not run, or a newer release's did),
            was never migrated, or cannot be read.
    """
    expected = expected_revision()
    found = await schema_revision(engine)
    if found is None:
        raise DatabaseNotReady(f"the database is not migrated (this release expects {expected}): run the migrations")
    if found != expected:
        raise DatabaseNotReady(f"the database is at migration {found}, this release expects {expected}")
