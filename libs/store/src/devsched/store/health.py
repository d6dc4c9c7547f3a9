"""What a service's readiness asks of the database: does it answer, and is its schema this release's.

Both run as the service's own role on its pool: `SELECT 1`, and the migration recorded in
`alembic_version`, which the service roles may read (`roles.GRANTS`) and nothing more. The failures are
`DatabaseNotReady` with one line fit for a probe's body: the driver's own message (a wrong password,
a refused connection), never the URL nor the SQL.
"""

from __future__ import annotations

from functools import lru_cache

import sqlalchemy.exc
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from devsched.store.engine import DatabaseTimeouts, DatabaseTlsError, make_engine

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
def _scripts() -> ScriptDirectory:
    from alembic.config import Config

    from devsched.store.migrations import SCRIPT_LOCATION

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    return ScriptDirectory.from_config(config)


def expected_revision() -> str:
    """The newest migration of this release (alembic's head of `devsched.store.migrations`)."""
    head = _scripts().get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError("devsched.store.migrations has no migrations")
    return head


@lru_cache(maxsize=1)
def known_revisions() -> frozenset[str]:
    """Every migration this release ships (the head and all before it)."""
    return frozenset(s.revision for s in _scripts().walk_revisions())


def schema_problem(found: str | None, expected: str, known: frozenset[str]) -> str | None:
    """Why a database at migration `found` cannot serve a release whose head is `expected`; None when it can.

    A database behind this release (never migrated, or at one of its older migrations) cannot: its tables
    lack what this code uses. One ahead of it (a migration this release does not know) can: during a
    rolling update the new release's migrations run before the old processes are gone, and each release's
    migrations only add what the one before it ignores (removals come a release later). So a rollout never
    turns the old replicas unready.
    """
    if found == expected:
        return None
    if found is None:
        return f"the database is not migrated (this release expects {expected}): run the migrations"
    if found in known:
        return f"the database is at migration {found}, this release expects {expected}: run the migrations"
    return None


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
        DatabaseNotReady: it is behind this release (never migrated, or the migration Job has not run yet),
            or cannot be read. A database ahead of this release is fine (`schema_problem`).
    """
    problem = schema_problem(await schema_revision(engine), expected_revision(), known_revisions())
    if problem is not None:
        raise DatabaseNotReady(problem)


async def reach_database(dsn: str, *, connect_s: float = 5.0) -> str:
    """Connect to `dsn` once as the service would, check its schema, and close (`--check-config`).

    Returns:
        What was found, in one line.

    Raises:
        DatabaseNotReady: no answer within `connect_s`, a refused login, a schema behind this release, or
            unusable TLS parameters in the URL.
    """
    try:
        engine = make_engine(dsn, timeouts=DatabaseTimeouts(connect_s=connect_s), pool_size=1, max_overflow=0)
    except DatabaseTlsError as exc:
        raise DatabaseNotReady(str(exc)) from None
    try:
        await ping(engine)
        await check_schema(engine)
        return f"answers, schema at {expected_revision()} or later"
    finally:
        await engine.dispose()
