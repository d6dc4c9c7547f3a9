"""Alembic environment: runs migrations over asyncpg with the URL given by `devsched.store.migrations`.

After the migrations, and on every run (also when there was nothing to migrate), the service roles'
grants are applied again, so they always match `devsched.store.roles.GRANTS`, including for tables a
later revision added.

A migration run holds an advisory lock for its whole length (`MIGRATIONS_LOCK`): two runs at once (two
releases' Jobs, a Job retried while its first pod still runs, `devsched migrate` beside them) take turns,
and the second finds the schema at head instead of failing on a table the first has just created.
"""

import asyncio

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from devsched.store.engine import ssl_connect_arg
from devsched.store.roles import MIGRATIONS_LOCK, DatabaseRoles, apply_grants

#: The revision that introduced the roles: below it (after a downgrade) there are no grants to keep.
_GRANTS_SINCE = "0003"


def _grants_kept(connection: Connection) -> bool:
    current = context.get_context().get_current_revision()
    if current is None:
        return False
    script = ScriptDirectory.from_config(context.config)
    return any(s.revision == _GRANTS_SINCE for s in script.iterate_revisions(current, "base"))


def _run(connection: Connection) -> None:
    # A session lock (it outlives the transactions below), committed at once so that alembic starts from
    # a connection outside any transaction; closing the connection releases it whatever happens.
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATIONS_LOCK})
    connection.commit()
    try:
        _migrate(connection)
    finally:
        connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATIONS_LOCK})
        connection.commit()


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()
    with connection.begin():
        if _grants_kept(connection):
            roles = context.config.attributes.get("devsched_roles")
            apply_grants(connection, roles if isinstance(roles, DatabaseRoles) else None)


async def _main() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "devsched.store.migrations sets sqlalchemy.url"
    bare, tls = ssl_connect_arg(url)  # libpq's sslmode/sslrootcert/... as asyncpg's TLS context
    engine = create_async_engine(
        bare, poolclass=pool.NullPool, hide_parameters=True, connect_args={} if tls is None else {"ssl": tls}
    )
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("devsched migrations run online only")
asyncio.run(_main())
