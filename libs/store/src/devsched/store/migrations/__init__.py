"""Alembic migrations of the devsched schema, with the URL injected from settings, never from an ini file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

from devsched.store.roles import DatabaseRoles

_HERE = Path(__file__).resolve().parent
#: Alembic's script location: this package's directory (its `versions/` hold the migrations).
SCRIPT_LOCATION = _HERE


def execute_script(script: str) -> None:
    """Run a migration's SQL script, statement by statement (split at a `;` that ends a paragraph).

    One `op.execute` per statement: asyncpg runs one statement per call. The split is only at `;` followed
    by a blank line, so a statement may hold `;` inside (a function body, a `DO` block).
    """
    from alembic import op

    for statement in script.split(";\n\n"):
        if statement.strip():
            op.execute(statement)


def _config(url: str, roles: DatabaseRoles | None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["devsched_roles"] = roles or DatabaseRoles.from_env()
    return cfg


def upgrade(url: str, revision: str = "head", *, roles: DatabaseRoles | None = None) -> None:
    """Apply the migrations up to `revision` to the database at `url` (`postgresql+asyncpg://...`).

    Run it as the owner role: the objects it creates belong to whoever runs it. Every run, even one with
    nothing to migrate, applies the service roles' grants again (`devsched.store.roles`); `roles`
    defaults to `DatabaseRoles.from_env()`.

    Synchronous, because alembic's env runs its own event loop; from async code use `upgrade_async`.
    """
    command.upgrade(_config(url, roles), revision)


def downgrade(url: str, revision: str, *, roles: DatabaseRoles | None = None) -> None:
    """Revert the migrations down to `revision` (`base` for an empty schema)."""
    command.downgrade(_config(url, roles), revision)


async def upgrade_async(url: str, revision: str = "head", *, roles: DatabaseRoles | None = None) -> None:
    """`upgrade` from inside a running event loop (runs alembic in a worker thread)."""
    await asyncio.to_thread(lambda: upgrade(url, revision, roles=roles))
