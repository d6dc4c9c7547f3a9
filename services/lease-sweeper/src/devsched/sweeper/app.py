"""The lease sweeper: every `sweep_interval_s`, end expired leases in batches until none is left.

It also applies the tasks' time limits (issue 13): queue timeouts, deadlines, and attempt timeouts that
the hosts did not enforce themselves (`Store.sweep_timeouts`).

The store decides each task's fate in the same transaction (requeue with attempts left, fail with
`lease_expired` at the limit, cancel when a cancellation is pending), keeps the expired attempt for
audit, and writes the events to the outbox. Several sweepers are safe: tasks are claimed with SKIP LOCKED.

The sweeper does not publish the outbox itself. The schedulers' relay does, woken by the sweeper's
`P.internal.wake`: one component owns JetStream publishing and the stream settings, the sweeper needs
no JetStream permissions, and a sweeper without NATS still sweeps (NATS only speeds up the wake-up; the
schedulers' periodic tick is the safety net).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from contextlib import AsyncExitStack
from datetime import timedelta

from nats.aio.client import Client
from opentelemetry import trace
from pydantic import Field, field_validator

from devsched.core.errors import DevschedError
from devsched.core.retention import PRUNE_BATCH_MAX, RETENTION_DEFAULT, check_retention
from devsched.protocol.codec import encode
from devsched.protocol.subjects import Subjects
from devsched.protocol.wake import Wake
from devsched.service import (
    Backoff,
    HealthServer,
    NotReady,
    ServiceSettings,
    Stopped,
    close_nats,
    connect_nats,
    mark_idle,
    serving_health,
    sleep_or_stop,
)
from devsched.service.health import plainly
from devsched.service.metrics import serve_metrics
from devsched.service.settings import Seconds
from devsched.store import ExpiredLease, Store
from devsched.store.health import DatabaseNotReady, check_schema, ping
from devsched.sweeper.metrics import PRUNED, READY, REGISTRY, count_expired, observe_store

log = logging.getLogger("devsched.sweeper")

#: The tracer of the sweep batches' spans (a proxy: it follows the provider `main` installs).
_TRACER = trace.get_tracer("devsched.sweeper")


class SweeperSettings(ServiceSettings):
    """Everything `devsched-sweeper` reads (`DEVSCHED_<NAME>` or `--<name>`)."""

    sweep_interval_s: Seconds = 1.0
    """Seconds between two sweeps of expired leases."""

    sweep_batch: int = Field(default=500, ge=1, le=10000)
    """Expired leases ended per transaction."""
    sweep_workers: int = Field(default=1, ge=1, le=8)
    """Sweep transactions run at once when many leases expired together. One by default: two took both
    cores of a small control plane's database from the live renewals while a mass expiry was swept (their
    p99 2.4 to 3.4x idle, against 1.9 to 2.1x with one; `devsched bench --only sweep`), and a renewal that
    waits too long lets another lease expire."""
    retention_days: float = Field(default=RETENTION_DEFAULT.days, ge=0, allow_inf_nan=False)
    """Ended tasks (with their attempts and events) are pruned this long after they last changed; 0 keeps
    them forever. At least an hour (1/24) otherwise."""
    prune_interval_s: float = Field(default=600.0, ge=1, allow_inf_nan=False)
    """How often the sweeper prunes ended tasks older than the retention."""
    prune_batch: int = Field(default=1000, ge=1, le=PRUNE_BATCH_MAX)
    """Tasks pruned per transaction."""

    @field_validator("retention_days")
    @classmethod
    def _retention_floor(cls, days: float) -> float:
        if days:
            check_retention(timedelta(days=days))
        return days

    @property
    def retention(self) -> timedelta | None:
        """How long ended tasks are kept; None: forever."""
        return timedelta(days=self.retention_days) if self.retention_days else None


def _log_expired(expired: list[ExpiredLease], message: str = "lease expired") -> None:
    """One line per ended lease, with its attempt, host, device and outcome (time limits: few)."""
    for lease in expired:
        log.info(message, extra=_lease_fields(lease))


def _lease_fields(lease: ExpiredLease) -> dict[str, object]:
    return {
        "task_id": lease.task_id,
        "attempt": lease.attempt,
        "lease_id": lease.lease_id,
        "host_id": lease.host_id,
        "device_id": lease.device_id,
        "task_status": lease.task_status.value,
        "reason": lease.reason,
    }


def _log_batch(expired: list[ExpiredLease]) -> None:
    """One INFO line per sweep batch: `leases expired`, its `count`, the tasks' outcomes, and `leases`.

    `leases` lists each ended lease as `<task_id>/<attempt>`, space-separated (grep a task id to find its
    expiry); each task's event (`P.events.task.<id>`) carries its host, device and reason. A line per lease
    with those (`lease expired`) is DEBUG: at ten thousand expired leases, formatting a line per lease cost
    the sweeper as much as a third of its own time.
    """
    if not expired:
        return
    if log.isEnabledFor(logging.DEBUG):
        for lease in expired:
            log.debug("lease expired", extra=_lease_fields(lease))
    outcomes = Counter(lease.task_status.value for lease in expired)
    log.info(
        "leases expired",
        extra={
            "count": len(expired),
            **{status: outcomes[status] for status in sorted(outcomes)},
            "leases": " ".join(f"{lease.task_id}/{lease.attempt}" for lease in expired),
        },
    )


class Sweeper:
    """One sweeper replica."""

    def __init__(self, settings: SweeperSettings) -> None:
        self.settings = settings
        self.ready = asyncio.Event()
        self.released = 0
        #: Tasks pruned so far.
        self.pruned = 0
        self._pruned_at: float | None = None
        self._nc: Client | None = None
        self._store: Store | None = None
        #: The health endpoints, when `metrics_port` is set.
        self.health: HealthServer | None = None

    def _add_checks(self, health: HealthServer) -> None:
        """Readiness: the database answers and is at this release's migration.

        NATS is not a condition: the sweeper sweeps without it (NATS only wakes the schedulers sooner), so
        a NATS outage must not take it out of service.
        """

        async def database() -> None:
            if self._store is None:
                raise NotReady("not connected yet")
            await plainly(ping(self._store.engine), DatabaseNotReady)

        async def schema() -> None:
            if self._store is None:
                raise NotReady("not connected yet")
            await plainly(check_schema(self._store.engine), DatabaseNotReady)

        health.check("database", database)
        health.check("schema", schema)

    async def sweep(self) -> int:
        """End every expired lease now, batch after batch; returns how many were ended.

        `sweep_workers` transactions run at once (SKIP LOCKED gives each its own leases), so the database
        works on one batch while this process builds and logs another.
        """
        assert self._store is not None
        store, limit = self._store, self.settings.sweep_batch

        async def work() -> int:
            ended = 0
            while True:
                with _TRACER.start_as_current_span("sweep batch", attributes={"devsched.batch.limit": limit}) as span:
                    expired = await store.sweep_expired(limit=limit)
                    span.set_attribute("devsched.batch.count", len(expired))
                    if not expired:
                        mark_idle(span)  # not exported: an idle sweeper would export a trace every interval
                _log_batch(expired)
                count_expired(expired)
                ended += len(expired)
                if len(expired) < limit:
                    return ended

        expired = sum(await asyncio.gather(*(work() for _ in range(self.settings.sweep_workers))))
        return expired + await self.sweep_timeouts()

    async def sweep_timeouts(self) -> int:
        """Apply the tasks' time limits now, batch after batch; how many tasks it failed or attempts it ended.

        Queued tasks past their `queue_timeout_s` or `deadline` fail; attempts past their `attempt_timeout_s`
        or deadline by a lease ttl (their host did not stop them) end. Few tasks have limits, so one worker.
        """
        assert self._store is not None
        limit, changed = self.settings.sweep_batch, 0
        while True:
            failed, overdue = await self._store.sweep_timeouts(limit=limit)
            for task_id in failed:
                log.info("task timed out while queued", extra={"task_id": task_id})
            _log_expired(overdue, "attempt timed out")
            # either wakes the schedulers: their relay publishes the events, their loop assigns what was freed
            changed += len(failed) + len(overdue)
            if len(failed) < limit and len(overdue) < limit:
                return changed

    async def prune(self) -> int:
        """Remove ended tasks older than the retention, batch after batch; returns how many.

        Each batch is one statement; a long backlog (the first run on an old database) is removed in
        batches so that no transaction holds many locks or runs long.
        """
        assert self._store is not None
        keep, limit = self.settings.retention, self.settings.prune_batch
        if keep is None:
            return 0
        pruned = 0
        while True:
            batch = await self._store.prune(keep, limit=limit)
            pruned += batch
            PRUNED.inc(batch)
            if batch < limit:
                break
        if pruned:
            log.info("pruned ended tasks", extra={"pruned": pruned, "retention_days": self.settings.retention_days})
        return pruned

    async def _prune_when_due(self) -> None:
        now = time.monotonic()
        if self._pruned_at is not None and now - self._pruned_at < self.settings.prune_interval_s:
            return
        self._pruned_at = now
        try:
            self.pruned += await self.prune()
        except DevschedError as exc:  # the next interval tries again; sweeping goes on
            log.warning("pruning failed: %s", exc.message, extra={"error": exc.code})

    async def _wake_schedulers(self, released: int) -> None:
        nc = self._nc
        if nc is None or not nc.is_connected:
            return
        with contextlib.suppress(Exception):  # best effort: the schedulers tick anyway
            await nc.publish(Subjects(self.settings.subject_prefix).internal_wake, encode(Wake(released=released)))

    async def _connect(self, stop: asyncio.Event) -> None:
        with contextlib.suppress(Stopped):
            self._nc = await connect_nats(
                self.settings,
                name=f"{self.settings.subject_prefix}-sweeper",
                stop=stop,
                drain_timeout_s=self.settings.drain_timeout_s,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep until `stop` is set; the sweep in progress finishes first."""
        s = self.settings
        async with AsyncExitStack() as stack:
            self.health = await stack.enter_async_context(
                serving_health(s.metrics_host, s.metrics_port, service=f"{s.subject_prefix}-sweeper")
            )
            if self.health is not None:
                self._add_checks(self.health)
                serve_metrics(self.health, REGISTRY, ready=READY, component="sweeper")
            self._store = Store.connect(
                s.database_dsn,
                heartbeat_interval_s=s.heartbeat_interval_s,
                device_grace_s=s.device_grace_s,
                quarantine_after=s.quarantine_after,
                pool_size=min(s.db_pool_size, max(2, s.sweep_workers)),
                max_overflow=1,
            )
            stack.push_async_callback(self._store.close)
            if self.health is not None:
                observe_store(self._store)
            connecting = asyncio.create_task(self._connect(stop))
            stack.push_async_callback(self._disconnect, connecting)
            log.info(
                "sweeping",
                extra={
                    "interval_s": s.sweep_interval_s,
                    "prefix": s.subject_prefix,
                    "retention_days": s.retention_days,
                },
            )
            self.ready.set()
            backoff = Backoff(base=s.sweep_interval_s, cap=max(5.0, s.sweep_interval_s))
            while not stop.is_set():
                try:
                    released = await self.sweep()
                except DevschedError as exc:
                    delay = backoff.next()
                    log.warning("sweep failed: %s", exc.message, extra={"error": exc.code, "retry_in_s": delay})
                    await sleep_or_stop(stop, delay)
                    continue
                backoff.reset()
                await self._prune_when_due()
                if released:
                    self.released += released
                    await self._wake_schedulers(released)
                await sleep_or_stop(stop, s.sweep_interval_s)
            log.info("stopped", extra={"released": self.released, "pruned": self.pruned})

    async def _disconnect(self, connecting: asyncio.Task[None]) -> None:
        if not connecting.done():
            connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        if self._nc is not None:
            await close_nats(self._nc)
