"""Fixtures for repository tests: a Store on a fresh migrated database, with a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from devsched.store import Committed, ManualClock, Store
from support.store_lab import Lab


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def store(database_url: str, clock: ManualClock) -> AsyncIterator[Store]:
    s = Store.connect(database_url, clock=clock, heartbeat_interval_s=5.0)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def lab(store: Store, clock: ManualClock) -> Lab:
    return Lab(store, clock)


@pytest.fixture
async def inline(database_url: str, clock: ManualClock) -> AsyncIterator[tuple[Lab, list[Committed]]]:
    """A lab whose store assigns inline, and the list its `on_commit` fills."""
    store = Store.connect(database_url, clock=clock, assign_inline=True)
    heard: list[Committed] = []
    store.on_commit = heard.append
    try:
        yield Lab(store, clock), heard
    finally:
        await store.close()
