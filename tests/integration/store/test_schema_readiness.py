"""The services' schema check against a real database at, behind and ahead of this release's migration."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from devsched.store.engine import make_engine
from devsched.store.health import DatabaseNotReady, check_schema, expected_revision

pytestmark = pytest.mark.integration


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    yield conn
    await conn.close()


async def _check(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        await check_schema(engine)
    finally:
        await engine.dispose()


async def test_the_schema_check_follows_the_recorded_migration(database_url: str, admin: asyncpg.Connection) -> None:
    await _check(database_url)  # the template is migrated to this release's head

    await admin.execute("UPDATE alembic_version SET version_num = '0005'")
    with pytest.raises(DatabaseNotReady, match=f"at migration 0005, this release expects {expected_revision()}"):
        await _check(database_url)

    # A newer release migrated first (a rolling update): this one keeps serving until it is replaced.
    await admin.execute("UPDATE alembic_version SET version_num = '9999_next_release'")
    await _check(database_url)
