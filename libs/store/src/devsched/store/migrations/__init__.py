"""Alembic migrations of the devsched schema, with the URL injected from settings, never from an ini file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

_HERE = Path(__file__).resolve().parent


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the migrations up to `revision` to the database at `url` (`postgresql+asyncpg://...`).

    Synchronous, because alembic's env runs its own event loop; from async code use `upgrade_async`.
    """
    command.upgrade(_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Revert the migrations down to `revision` (`base` for an empty schema)."""
    command.downgrade(_config(url), revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    """`upgrade` from inside a running event loop (runs alembic in a worker thread)."""
    await asyncio.to_thread(upgrade, url, revision)
