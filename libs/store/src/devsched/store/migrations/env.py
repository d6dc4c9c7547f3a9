"""Alembic environment: runs migrations over asyncpg with the URL given by `devsched.store.migrations`."""

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from devsched.store.engine import ssl_connect_arg


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _main() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "devsched.store.migrations sets sqlalchemy.url"
    bare, tls = ssl_connect_arg(url)  # libpq's sslmode/sslrootcert/... as asyncpg's TLS context
    engine = create_async_engine(bare, poolclass=pool.NullPool, connect_args={} if tls is None else {"ssl": tls})
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("devsched migrations run online only")
asyncio.run(_main())
