"""Helpers for repository tests: build the situations the spec scenarios start from."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from devsched.core.events import AttemptAssigned, DeviceEvent, TaskEvent
from devsched.core.records import LeaseRef, Selector
from devsched.store import Committed, DeviceSpec, ManualClock, NewTask, Store

PLAN: Mapping[str, Any] = {"steps": [{"name": "flash", "action": "noop", "args": {}}]}


@dataclass
class Lab:
    """A store with helpers to build the situations the scenarios start from."""

    store: Store
    clock: ManualClock

    async def host(self, host_id: str = "h1", *devices: str, **labels: str) -> None:
        names = devices or (f"{host_id}-d1",)
        await self.store.register_host(host_id, [DeviceSpec(d, labels or {"platform": "android"}) for d in names])

    async def submit(self, **kwargs: Any) -> uuid.UUID:
        kwargs.setdefault("plan", PLAN)
        if "labels" in kwargs or "device_id" in kwargs:
            kwargs["selector"] = Selector(kwargs.pop("labels", {}), kwargs.pop("device_id", None))
        return (await self.store.submit(NewTask(**kwargs))).task_id

    async def assign_one(self, task_id: uuid.UUID) -> LeaseRef:
        """Assign and return the lease of `task_id` (fails if it was not assigned)."""
        for m in await self.store.assign():
            if m.task_id == task_id:
                return ref(m)
        view = await self.store.get_task(task_id)
        raise AssertionError(f"task {task_id} not assigned: {view.status} {view.pending_reason}")

    async def running(self, **kwargs: Any) -> LeaseRef:
        """A submitted, assigned and claimed (dispatched) task."""
        task_id = await self.submit(**kwargs)
        lease = await self.assign_one(task_id)
        await self.store.claim(lease)
        return lease

    async def expire(self, lease: LeaseRef, ttl: float = 30) -> None:
        """Move past the lease's expiry, keeping hosts alive, and sweep."""
        self.clock.advance(ttl + 1)
        for h in await self.store.list_hosts():
            await self.store.heartbeat(h.host_id)
        await self.store.sweep_expired()

    async def alive(self) -> None:
        for h in await self.store.list_hosts():
            await self.store.heartbeat(h.host_id)


def kinds(c: Committed) -> list[str]:
    """The kinds of the messages a commit wrote, in order (`assignment` for an assignment)."""
    return [m.event.event.value if isinstance(m.event, TaskEvent | DeviceEvent) else "assignment" for m in c.messages]


def ref(m: AttemptAssigned) -> LeaseRef:
    return LeaseRef(m.host_id, m.task_id, m.attempt, m.lease_id)


_TABLES = ("hosts", "devices", "tasks", "attempts", "reservations", "cancel_requests", "outbox")


async def snapshot(store: Store, *, ignore_liveness: bool = True) -> dict[str, list[str]]:
    """Every row of every table as text, to prove an operation changed nothing."""
    out: dict[str, list[str]] = {}
    async with store.engine.connect() as conn:
        for table in _TABLES:
            rows = (await conn.execute(text(f"SELECT to_jsonb(x) FROM {table} x"))).scalars().all()
            docs = []
            for row in rows:
                if ignore_liveness and table == "hosts":
                    row = {k: v for k, v in row.items() if k != "last_seen_at"}
                docs.append(repr(sorted(row.items())))
            out[table] = sorted(docs)
    return out
