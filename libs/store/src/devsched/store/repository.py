"""The Store: one method per domain operation, each applied whole.

Most run in one transaction; a submit, a heartbeat and a granted claim, renewal or report are one
statement each (`Transactor.statements`), and a lease request that statement does not grant goes on to
the locked transaction that names the conflict.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from devsched.core.errors import InvalidRequest
from devsched.core.events import AttemptAssigned
from devsched.core.ids import is_token, new_task_id
from devsched.core.leases import Extension
from devsched.core.limits import LIST_LIMIT_DEFAULT
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskStatus
from devsched.core.views import DeviceView, HostView, TaskPage, TaskView
from devsched.store import assignment, grants, hosts, leasing, liveness, outbox, queries, sweeping, tasks
from devsched.store.clock import Clock, DatabaseClock
from devsched.store.driver import Driver
from devsched.store.engine import DatabaseTimeouts, make_engine
from devsched.store.liveness import Rejected
from devsched.store.transaction import Transactor
from devsched.store.views import (
    CancelReceipt,
    DeviceSpec,
    ExpiredLease,
    NewTask,
    ReportReceipt,
    Submitted,
)

T = TypeVar("T")


def _unwrap(value: T | Rejected) -> T:
    if isinstance(value, Rejected):
        raise value.error
    return value


class Store:
    """The devsched repository over Postgres.

    Args:
        engine: an asyncpg engine (see `make_engine`).
        clock: where `now` comes from; the database clock unless a test controls time.
        heartbeat_interval_s: the interval hosts are told to heartbeat at; 3 missed make a host offline.
        device_grace_s: how long a device whose lease expired stays out of use; default its task's ttl.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock | None = None,
        heartbeat_interval_s: float = 5.0,
        device_grace_s: float | None = None,
    ) -> None:
        if heartbeat_interval_s < 0.5:
            # liveness is written at most once a second and a host is offline after 3 intervals
            raise ValueError(f"heartbeat_interval_s must be at least 0.5, not {heartbeat_interval_s}")
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.device_grace_s = device_grace_s
        self._tx = Transactor(engine, self.clock)

    @classmethod
    def connect(cls, url: str, *, timeouts: DatabaseTimeouts | None = None, **kwargs: Any) -> Store:
        """A Store with its own engine for `url` (`postgresql+asyncpg://...`)."""
        pool = {k: kwargs.pop(k) for k in ("pool_size", "max_overflow") if k in kwargs}
        return cls(make_engine(url, timeouts=timeouts, **pool), **kwargs)

    async def close(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()

    # -- users -------------------------------------------------------------------------------

    async def submit(self, new: NewTask) -> Submitted:
        """Queue a task (or return the existing one for a repeated idempotency key)."""
        task_id = new_task_id()

        async def op(db: Driver) -> Submitted:
            return await tasks.submit(db, self.clock, new, task_id)

        return await self._tx.statements(op, name="submit")

    async def request_cancel(self, task_id: uuid.UUID, reason: str | None = None) -> CancelReceipt:
        """Cancel a queued task now, or record a cancellation request against an in-flight one."""

        async def op(conn: AsyncConnection, now: datetime) -> CancelReceipt:
            return await tasks.request_cancel(conn, now, outbox.Outbox(), task_id, reason)

        return await self._tx.run(op, name="cancel")

    async def get_task(self, task_id: uuid.UUID) -> TaskView:
        """The task with its attempts and, while queued, why it waits."""

        async def op(conn: AsyncConnection, now: datetime) -> TaskView:
            return await queries.get_task(conn, now, task_id)

        return await self._tx.run(op, name="get_task")

    async def list_tasks(
        self, *, status: TaskStatus | None = None, limit: int = LIST_LIMIT_DEFAULT, after: str | None = None
    ) -> TaskPage:
        """One page of tasks, newest first."""

        async def op(conn: AsyncConnection, now: datetime) -> TaskPage:
            return await queries.list_tasks(conn, status, limit, after)

        return await self._tx.run(op, name="list_tasks")

    # -- hosts -------------------------------------------------------------------------------

    async def register_host(
        self, host_id: str, devices: Sequence[DeviceSpec], agent_version: str | None = None
    ) -> float:
        """Register a host with exactly these devices; returns the heartbeat interval to use."""
        if not is_token(host_id):
            raise InvalidRequest(
                f"host id {host_id!r} is not a token", errors=[{"path": "host_id", "message": "not a token"}]
            )

        async def op(conn: AsyncConnection, now: datetime) -> None:
            await hosts.register_host(conn, now, host_id, devices, agent_version, self.heartbeat_interval_s)

        await self._tx.run(op, name="register")
        return self.heartbeat_interval_s

    async def heartbeat(self, host_id: str) -> float:
        """Record a sign of life; returns the heartbeat interval."""

        async def op(db: Driver) -> None:
            await liveness.heartbeat(db, self.clock, host_id)

        await self._tx.statements(op, name="heartbeat")
        return self.heartbeat_interval_s

    async def list_hosts(self) -> tuple[HostView, ...]:
        """Every host with its devices and their states."""

        async def op(conn: AsyncConnection, now: datetime) -> tuple[HostView, ...]:
            return await hosts.list_hosts(conn, now)

        return await self._tx.run(op, name="list_hosts")

    async def drain_device(self, device_id: str, drained: bool, reason: str | None = None) -> DeviceView:
        """Take a device out of service, or return it."""

        async def op(conn: AsyncConnection, now: datetime) -> DeviceView:
            return await hosts.drain_device(conn, now, device_id, drained, reason)

        return await self._tx.run(op, name="drain")

    # -- leases ------------------------------------------------------------------------------

    # A lease request is first tried as one statement that applies it only if it is granted
    # (`grants`); when that matches nothing, the locked path (`leasing`) names the conflict.

    async def claim(self, ref: LeaseRef) -> Extension:
        """The owning host starts its attempt (a repeated claim is answered as a renewal)."""

        async def granted(db: Driver) -> Extension | None:
            return await grants.claim(db, self.clock, ref)

        async def op(conn: AsyncConnection, now: datetime) -> Extension | Rejected:
            return await leasing.extend(conn, now, outbox.Outbox(), ref, claim=True, clock=self.clock)

        if (grant := await self._tx.statements(granted, name="claim")) is not None:
            return grant
        return _unwrap(await self._tx.run(op, name="claim"))

    async def renew(self, ref: LeaseRef, progress: Mapping[str, Any] | None = None) -> Extension:
        """Extend the lease by its ttl; the reply says whether a cancellation is pending."""

        async def granted(db: Driver) -> Extension | None:
            return await grants.renew(db, self.clock, ref, progress)

        async def op(conn: AsyncConnection, now: datetime) -> Extension | Rejected:
            return await leasing.extend(
                conn, now, outbox.Outbox(), ref, claim=False, clock=self.clock, progress=progress
            )

        if (grant := await self._tx.statements(granted, name="renew")) is not None:
            return grant
        return _unwrap(await self._tx.run(op, name="renew"))

    async def report(
        self,
        ref: LeaseRef,
        outcome: Outcome,
        *,
        reason: str | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> ReportReceipt:
        """Record the attempt's terminal outcome; an identical repeat returns the first answer."""

        async def granted(db: Driver) -> ReportReceipt | None:
            return await grants.report(db, self.clock, ref, outcome, reason, result)

        async def op(conn: AsyncConnection, now: datetime) -> ReportReceipt | Rejected:
            return await leasing.report(conn, now, outbox.Outbox(), ref, outcome, reason, result, self.clock)

        if (receipt := await self._tx.statements(granted, name="report")) is not None:
            return receipt
        return _unwrap(await self._tx.run(op, name="report"))

    # -- scheduler and sweeper ---------------------------------------------------------------

    async def assign(self, *, limit: int = 200, device_limit: int = 2000) -> list[AttemptAssigned]:
        """Assign up to `limit` queued tasks to free matching devices; returns the new attempts."""

        async def op(conn: AsyncConnection, now: datetime) -> list[AttemptAssigned]:
            return await assignment.assign(
                conn, now, outbox.Outbox(), limit=limit, device_limit=device_limit, clock=self.clock
            )

        return await self._tx.run(op, name="assign")

    async def sweep_expired(self, *, limit: int = 500) -> list[ExpiredLease]:
        """End up to `limit` expired leases: requeue, fail (`lease_expired`) or cancel their tasks."""

        async def op(conn: AsyncConnection, now: datetime) -> list[ExpiredLease]:
            return await sweeping.sweep_expired(
                conn, now, outbox.Outbox(), limit=limit, device_grace_s=self.device_grace_s, clock=self.clock
            )

        return await self._tx.run(op, name="sweep")

    async def relay_outbox(self, publish: outbox.PublishBatch, *, limit: int = 200) -> int:
        """Hand up to `limit` unsent outbox messages, in order, to `publish`; returns how many it published.

        One transaction: the batch stays claimed (other relays skip it) while `publish` runs, and the
        messages it acknowledged are marked sent when it returns.

        Raises:
            Exception: the error that stopped `publish`, after the messages it did publish were marked.
        """

        async def op(conn: AsyncConnection, now: datetime) -> outbox.Published:
            return await outbox.relay(conn, now, publish, limit)

        outcome = await self._tx.run(op, name="relay")
        if outcome.error is not None:
            raise outcome.error
        return len(set(outcome.ids))

    async def unsent_count(self) -> int:
        """How many outbox messages wait to be published."""

        async def op(conn: AsyncConnection, now: datetime) -> int:
            return await outbox.unsent_count(conn)

        return await self._tx.run(op, name="unsent_count")
