"""The Store: one method per domain operation, each applied whole.

Most run in one transaction; a submit, a heartbeat and a granted claim, renewal or report are one
statement each (`Transactor.statements`; a submit that places its task and a report that hands its device
on are two, in one transaction of the driver), and a lease request that statement does not grant goes on
to the locked transaction that names the conflict.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from devsched.core.errors import DevschedError, InvalidRequest
from devsched.core.events import AttemptAssigned
from devsched.core.health import QUARANTINE_AFTER_DEFAULT
from devsched.core.ids import is_token, new_task_id
from devsched.core.leases import Extension
from devsched.core.limits import LIST_LIMIT_DEFAULT, MAX_RELEASES_DEFAULT
from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskKind, TaskStatus
from devsched.core.views import (
    ArtifactView,
    DeviceView,
    ForgottenDevice,
    HealthCheckView,
    HostView,
    TaskPage,
    TaskView,
)
from devsched.store import (
    artifacts,
    grants,
    healthchecks,
    hosts,
    leasing,
    liveness,
    operator_devices,
    outbox,
    pruning,
    queries,
    releasing,
    resync,
    stats,
    sweeping,
    tasks,
    timeouts,
)
from devsched.store.clock import Clock, DatabaseClock
from devsched.store.driver import Driver, in_transaction
from devsched.store.engine import DatabaseTimeouts, make_engine
from devsched.store.liveness import Rejected
from devsched.store.placement import assignment, handover, submitted
from devsched.store.transaction import OperationHook, Transactor
from devsched.store.views import (
    ActionSpec,
    CancelReceipt,
    Committed,
    DeviceSpec,
    ExpiredLease,
    Handed,
    HostReport,
    NewTask,
    OutboxMessage,
    ReleaseReceipt,
    ReportReceipt,
    Submitted,
    Unclaimed,
)

T = TypeVar("T")

log = logging.getLogger("devsched.store")

#: Told, right after each commit of a writing operation, what it leaves to do; must not raise.
CommitHook = Callable[[Committed], None]


class _Changes:
    """One try of a writing operation: its outbox, and whether it leaves work for an assignment pass."""

    def __init__(self, *, returning: bool, assignable: bool) -> None:
        self.outbox = outbox.Outbox(defer=True, returning=returning)
        self.assignable = assignable
        #: Messages a statement of the operation inserted itself (`devsched.store.inline`).
        self.inline: list[OutboxMessage] = []


#: A writing operation: runs in the transaction, records its events in `changes.outbox`.
_Write = Callable[[AsyncConnection, datetime, _Changes], Awaitable[T]]


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
        max_releases: how many times a task may be released and requeued; the next release fails it.
        assign_inline: a submit places its task on a free device, and a report hands the device it frees
            to the next queued task, in their own transactions (what the scheduler does); otherwise only
            `assign` assigns.
        quarantine_after: consecutive infrastructure failures that quarantine a device (0: never).

    `on_commit`, when set, is told after every commit of a writing operation which outbox messages it
    wrote (to publish them at once) and whether it leaves work for an assignment pass.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock | None = None,
        heartbeat_interval_s: float = 5.0,
        device_grace_s: float | None = None,
        max_releases: int = MAX_RELEASES_DEFAULT,
        assign_inline: bool = False,
        quarantine_after: int = QUARANTINE_AFTER_DEFAULT,
    ) -> None:
        if heartbeat_interval_s < 0.5:
            # liveness is written at most once a second and a host is offline after 3 intervals
            raise ValueError(f"heartbeat_interval_s must be at least 0.5, not {heartbeat_interval_s}")
        self.engine = engine
        self.clock: Clock = clock or DatabaseClock()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.device_grace_s = device_grace_s
        if max_releases < 0:
            raise ValueError(f"max_releases must be at least 0, not {max_releases}")
        self.max_releases = max_releases
        self.assign_inline = assign_inline
        if quarantine_after < 0:
            raise ValueError(f"quarantine_after must be at least 0, not {quarantine_after}")
        self.quarantine_after = quarantine_after
        self.on_commit: CommitHook | None = None
        self._tx = Transactor(engine, self.clock)
        self._nothing_free = submitted.NothingFree()
        self._signs = liveness.RecentSigns(self.clock)

    @classmethod
    def connect(cls, url: str, *, timeouts: DatabaseTimeouts | None = None, **kwargs: Any) -> Store:
        """A Store with its own engine for `url` (`postgresql+asyncpg://...`)."""
        pool = {k: kwargs.pop(k) for k in ("pool_size", "max_overflow") if k in kwargs}
        return cls(make_engine(url, timeouts=timeouts, **pool), **kwargs)

    async def close(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()

    @property
    def on_operation(self) -> OperationHook | None:
        """Told of every operation's name and duration in seconds, however it ended (the metrics)."""
        return self._tx.on_operation

    @on_operation.setter
    def on_operation(self, hook: OperationHook | None) -> None:
        self._tx.on_operation = hook

    async def _write(self, name: str, op: _Write[T], *, assignable: bool) -> T:
        """Run a writing operation in one transaction; its events are written at its end, in one statement.

        After the commit (only then: a transaction that rolled back published nothing), `on_commit` hears
        of the messages written and of whether an assignment pass may find work (`assignable`, the
        default the operation may change).
        """
        tries: list[_Changes] = []

        async def run(conn: AsyncConnection, now: datetime) -> T:
            changes = _Changes(returning=self.on_commit is not None, assignable=assignable)
            tries[:] = [changes]  # a retried transaction starts over: only the last try committed
            result = await op(conn, now, changes)
            await changes.outbox.write(conn, now)
            return result

        result = await self._tx.run(run, name=name)
        if tries:
            self._committed(name, [*tries[0].inline, *tries[0].outbox.written], assignable=tries[0].assignable)
        return result

    def _committed(self, name: str, messages: Sequence[OutboxMessage], *, assignable: bool) -> None:
        """Tell `on_commit` what a committed operation wrote and whether it leaves assignable work."""
        hook = self.on_commit
        if hook is None or not (messages or assignable):
            return
        try:
            hook(Committed(name, tuple(sorted(messages, key=lambda m: m.id)), assignable))
        except Exception:  # the change is committed; the relay publishes what the hook could not take
            log.exception("commit hook failed", extra={"operation": name})

    # -- users -------------------------------------------------------------------------------

    async def submit(self, new: NewTask) -> Submitted:
        """Queue a task (or return the existing one for a repeated idempotency key).

        One statement; with `assign_inline`, it and the placement of the new task (`placement.submitted`) are one
        transaction of two statements, run through the driver; but a selector whose last look found no free
        device is submitted in one statement that counts them, and placed in a second transaction only
        when it finds some (`submitted.NothingFree`).
        """
        task_id = new_task_id()
        written: list[OutboxMessage] = []
        assignable = False
        key = submitted.NothingFree.key(new.selector) if self.assign_inline else None
        if key is not None and key in self._nothing_free:
            return await self._submit_looking(new, task_id, key)

        async def run(db: Driver) -> Submitted:
            nonlocal assignable
            written.clear()  # a statement run again starts over
            if key is None:
                done = await tasks.submit(db, self.clock, new, task_id, written)
                assignable = done.created
                return done
            async with db.transaction():
                done = await tasks.submit(db, self.clock, new, task_id, written)
                assignable = False  # a repeated key adds nothing to assign
                if done.created:
                    placed, free = await submitted.place(db, self.clock, task_id, new.selector, written)
                    assignable = not placed.settled
                    self._nothing_free.saw(key, free)
            return done

        done = await self._tx.statements(run, name="submit")
        self._committed("submit", written, assignable=assignable)
        return done

    async def _submit_looking(self, new: NewTask, task_id: uuid.UUID, key: submitted.SelectorKey) -> Submitted:
        """The submit of a selector that found no free device last time: one statement, which counts them.

        When it finds some after all, the placement runs in a transaction of its own once the task is
        committed; if that fails, the task is queued all the same and left to the loop's pass.
        """
        written: list[OutboxMessage] = []
        free: int | None = None

        async def run(db: Driver) -> Submitted:
            nonlocal free
            written.clear()
            done, free = await tasks.submit_looking(db, self.clock, new, task_id, written)
            return done

        done = await self._tx.statements(run, name="submit")
        assignable = done.created and free is None  # its own repeat: whether it was placed is not known
        if done.created and free:
            placed: list[OutboxMessage] = []

            async def place(db: Driver) -> bool:
                placed.clear()
                outcome, found = await submitted.place(db, self.clock, task_id, new.selector, placed)
                self._nothing_free.saw(key, found)
                return outcome.settled

            try:
                assignable = not await self._tx.statements(place, name="place")
            except Exception:  # the task is committed and queued: the loop places it
                log.warning("placement after submit failed", exc_info=True, extra={"task_id": str(task_id)})
                placed.clear()  # what a failed try wrote is not committed, or is the table's to publish
                assignable = True
            written += placed
        elif free is not None:
            self._nothing_free.saw(key, free)
        self._committed("submit", written, assignable=assignable)
        return done

    async def request_cancel(self, task_id: uuid.UUID, reason: str | None = None) -> CancelReceipt:
        """Cancel a queued task now, or record a cancellation request against an in-flight one."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> CancelReceipt:
            return await tasks.request_cancel(conn, now, changes.outbox, task_id, reason)

        return await self._write("cancel", op, assignable=False)

    async def get_task(self, task_id: uuid.UUID) -> TaskView:
        """The task with its attempts and, while queued, why it waits."""

        async def op(conn: AsyncConnection, now: datetime) -> TaskView:
            return await queries.get_task(conn, now, task_id)

        return await self._tx.run(op, name="get_task")

    async def list_tasks(
        self,
        *,
        status: TaskStatus | None = None,
        limit: int = LIST_LIMIT_DEFAULT,
        after: str | None = None,
        kind: TaskKind | None = None,
        device_id: str | None = None,
        id_prefix: str | None = None,
    ) -> TaskPage:
        """One page of tasks, newest first, each queued one with its `pending_reason` (worked out for the page at once).

        `kind`: only user tasks, or only health tasks; `device_id`: only tasks that had an attempt on that device;
        `id_prefix`: only tasks whose id starts with it.
        """

        async def op(conn: AsyncConnection, now: datetime) -> TaskPage:
            return await queries.list_tasks(conn, now, status, limit, after, kind, device_id, id_prefix)

        return await self._tx.run(op, name="list_tasks")

    # -- hosts -------------------------------------------------------------------------------

    async def register_host(
        self,
        host_id: str,
        devices: Sequence[DeviceSpec],
        agent_version: str | None = None,
        actions: Sequence[ActionSpec] = (),
    ) -> float:
        """Register a host with exactly these devices and actions; returns the heartbeat interval to use."""
        if not is_token(host_id):
            raise InvalidRequest(
                f"host id {host_id!r} is not a token", errors=[{"path": "host_id", "message": "not a token"}]
            )

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> None:
            await hosts.register_host(conn, now, host_id, devices, agent_version, self.heartbeat_interval_s, actions)

        await self._write("register", op, assignable=True)
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

    async def action_schemas(self, names: Sequence[str]) -> dict[str, list[dict[str, Any] | None]]:
        """The args schemas hosts advertise for these actions (`hosts.action_schemas`)."""

        async def op(conn: AsyncConnection, now: datetime) -> dict[str, list[dict[str, Any] | None]]:
            return await hosts.action_schemas(conn, names)

        return await self._tx.run(op, name="action_schemas")

    async def drain_device(self, device_id: str, drained: bool, reason: str | None = None) -> DeviceView:
        """Take a device out of service, or return it."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> DeviceView:
            return await hosts.drain_device(conn, now, changes.outbox, device_id, drained, reason)

        return await self._write("drain", op, assignable=not drained)

    async def forget_device(self, device_id: str, reason: str) -> ForgottenDevice:
        """Free a device from its host, audited (`operator_devices.forget_device`)."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> ForgottenDevice:
            return await operator_devices.forget_device(conn, now, device_id, reason)

        return await self._write("forget_device", op, assignable=False)

    async def label_device(
        self, device_id: str, set_labels: Mapping[str, str], unset: Sequence[str] = ()
    ) -> DeviceView:
        """Pin (and unpin) operator labels on a device, audited; the device after the change."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> DeviceView:
            return await operator_devices.label_device(conn, now, device_id, set_labels, unset)

        return await self._write("label_device", op, assignable=True)

    async def drain_host(self, host_id: str, drained: bool, reason: str | None = None) -> HostView:
        """Take every device the host lists out of service, or return them all; the host after the change."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> HostView:
            return await hosts.drain_host(conn, now, changes.outbox, host_id, drained, reason)

        return await self._write("drain_host", op, assignable=not drained)

    # -- leases ------------------------------------------------------------------------------

    # A lease request is first tried as one statement that applies it only if it is granted
    # (`grants`); when that matches nothing, the locked path (`leasing`) names the conflict.

    async def claim(self, ref: LeaseRef, progress: Mapping[str, Any] | None = None) -> Extension:
        """The owning host starts its attempt (a repeated claim is answered as a renewal).

        `progress` (the first step's) is kept as a renewal carrying it would keep it, in the same statement.
        """
        return await self._extend(ref, progress, claim=True)

    async def renew(self, ref: LeaseRef, progress: Mapping[str, Any] | None = None) -> Extension:
        """Extend the lease by its ttl; the reply says whether a cancellation is pending."""
        return await self._extend(ref, progress, claim=False)

    async def renewals(
        self, host_id: str, leases: Sequence[tuple[LeaseRef, Mapping[str, Any] | None]]
    ) -> list[Extension | DevschedError]:
        """Renew several leases of `host_id`; each lease's grant, or the error `renew` would have raised.

        The leases without progress are extended in one statement; a lease it does not grant, and one
        with progress (a step boundary: its event takes the task's lock), goes through `renew`, which
        names the conflict. In the order of `leases`.

        Raises:
            InvalidRequest: a lease of another host (the caller builds the refs from the subject's host).
        """
        if any(ref.host_id != host_id for ref, _ in leases):
            raise InvalidRequest("every lease of a renewals request is the requesting host's")
        plain = [ref for ref, progress in leases if progress is None]
        granted: dict[tuple[str, int], Extension] = {}
        if plain:
            with self._signs.signing(host_id) as touch:

                async def statement(db: Driver) -> dict[tuple[str, int], Extension]:
                    return await grants.renewals(db, self.clock, host_id, plain, touch=touch)

                granted = await self._tx.statements(statement, name="renewals")
        answers: list[Extension | DevschedError] = []
        for ref, progress in leases:
            grant = granted.get((str(ref.task_id), ref.attempt)) if progress is None else None
            if grant is None:
                try:
                    grant = await self.renew(ref, progress)
                except DevschedError as exc:
                    answers.append(exc)
                    continue
            answers.append(grant)
        return answers

    async def _extend(self, ref: LeaseRef, progress: Mapping[str, Any] | None, *, claim: bool) -> Extension:
        """A claim or a renewal: the one statement, else the same under the task's lock, which names a conflict."""
        name, grant_of = ("claim", grants.claim) if claim else ("renew", grants.renew)
        written: list[OutboxMessage] = []

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> Extension | Rejected:
            changes.inline.clear()
            return await leasing.extend(
                conn, now, changes.inline, ref, claim=claim, clock=self.clock, progress=progress
            )

        with self._signs.signing(ref.host_id) as touch:

            async def granted(db: Driver) -> Extension | None:
                written.clear()  # a statement run again starts over
                return await grant_of(db, self.clock, ref, progress, written, touch=touch)

            if (grant := await self._tx.statements(granted, name=name)) is not None:
                self._committed(name, written, assignable=False)
                return grant
            return _unwrap(await self._write(name, op, assignable=False))

    async def report(
        self,
        ref: LeaseRef,
        outcome: Outcome,
        *,
        reason: str | None = None,
        result: Mapping[str, Any] | None = None,
        take_next: bool = False,
    ) -> ReportReceipt:
        """Record the attempt's terminal outcome; an identical repeat returns the first answer.

        With `assign_inline`, the grant's statement and the hand-over of the device it frees
        (`handover`) are one transaction of two statements, run through the driver. With `take_next` too,
        the device's next attempt is handed to the reporting host already dispatched, and the receipt
        carries it (`next`); a duplicate's receipt carries the attempt its first answer handed over, while
        that is still to run.
        """
        written: list[OutboxMessage] = []
        assignable = True  # the device is free: a pass may give it work
        dispatch = take_next and self.assign_inline
        handed: Handed | None = None

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> ReportReceipt | Rejected:
            receipt = await leasing.report(
                conn, now, changes.outbox, ref, outcome, reason, result, self.clock,
                quarantine_after=self.quarantine_after,
            )  # fmt: skip
            if isinstance(receipt, ReportReceipt) and receipt.duplicate and dispatch:
                db = await in_transaction(conn)
                again = await handover.handed_again(db, self.clock, ref.host_id, ref.task_id, ref.attempt)
                return receipt if again is None else replace(receipt, next=again)
            if isinstance(receipt, ReportReceipt) and not receipt.duplicate:
                changes.assignable = True  # the device is free
                if self.assign_inline:
                    await changes.outbox.write(conn, now)  # the report's event before the assignment's
                    db = await in_transaction(conn)
                    placed, next_ = await handover.hand_over(
                        db, self.clock, ref.task_id, ref.attempt, changes.inline, dispatch=dispatch
                    )
                    changes.assignable = not placed.settled
                    if next_ is not None:
                        return replace(receipt, next=next_)
            return receipt

        with self._signs.signing(ref.host_id) as touch:

            async def granted(db: Driver) -> ReportReceipt | None:
                nonlocal assignable, handed
                written.clear()  # a statement run again starts over
                assignable, handed = True, None
                if not self.assign_inline:
                    return await grants.report(db, self.clock, ref, outcome, reason, result, written, touch=touch)
                async with db.transaction():
                    receipt = await grants.report(db, self.clock, ref, outcome, reason, result, written, touch=touch)
                    if receipt is not None:
                        placed, handed = await handover.hand_over(
                            db, self.clock, ref.task_id, ref.attempt, written, dispatch=dispatch
                        )
                        assignable = not placed.settled
                return receipt

            if (done := await self._tx.statements(granted, name="report")) is not None:
                self._committed("report", written, assignable=assignable)
                return done if handed is None else replace(done, next=handed)
            return _unwrap(await self._write("report", op, assignable=False))

    async def reports(self, host_id: str, batch: Sequence[HostReport]) -> list[ReportReceipt | None]:
        """Several reports of `host_id` applied together: one transaction, one commit (group commit).

        Each report is the statement `report` tries first, with its hand-over, in the order given; a report
        it does not grant (a repeat, a conflict, a retry or anything else the locked path decides) is
        answered None and changes nothing: `report` names it. When the transaction fails as a whole, every
        report is None and goes through `report` on its own: nothing is lost, only the batching.

        Raises:
            InvalidRequest: a report of another host (the caller builds the refs from the subject's host).
        """
        if any(item.ref.host_id != host_id for item in batch):
            raise InvalidRequest("every report of a batch must be of the host that sends it")
        written: list[OutboxMessage] = []
        answers: list[ReportReceipt | None] = []
        assignable = False
        if not batch:
            return answers

        async def granted(db: Driver, touch: bool) -> None:
            nonlocal assignable
            written.clear()  # a transaction run again starts over
            answers.clear()
            assignable = False
            async with db.transaction():
                for item in batch:
                    ref = item.ref
                    receipt = await grants.report(
                        db, self.clock, ref, item.outcome, item.reason, item.result, written, touch=touch
                    )
                    touch = False  # the host's sign of life once in the transaction
                    if receipt is not None and self.assign_inline:
                        placed, handed = await handover.hand_over(
                            db, self.clock, ref.task_id, ref.attempt, written, dispatch=item.take_next
                        )
                        assignable = assignable or not placed.settled
                        receipt = receipt if handed is None else replace(receipt, next=handed)
                    elif receipt is not None:
                        assignable = True  # the device is free: a pass may give it work
                    answers.append(receipt)

        try:
            with self._signs.signing(host_id) as touch:
                await self._tx.statements(functools.partial(granted, touch=touch), name="reports")
        except Exception:  # each report on its own then: `report` answers it, error and all
            log.warning("batched reports failed as a whole", exc_info=True, extra={"host_id": host_id})
            return [None] * len(batch)
        self._committed("reports", written, assignable=assignable)
        return answers

    async def release(
        self,
        ref: LeaseRef,
        *,
        reason: str | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> ReleaseReceipt:
        """The owning host gives its attempt back: the device is free at once, the task queued again.

        Or cancelled when a cancellation is pending, or failed (`released_too_often`) once the task was
        released `max_releases` times; an identical repeat returns the first answer.
        """

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> ReleaseReceipt | Rejected:
            receipt = await releasing.release(
                conn, now, changes.outbox, ref, reason, result, self.clock, max_releases=self.max_releases,
                quarantine_after=self.quarantine_after,
            )  # fmt: skip
            # the device is free and the task may be queued again: the assignment loop takes both
            changes.assignable = isinstance(receipt, ReleaseReceipt) and not receipt.duplicate
            return receipt

        return _unwrap(await self._write("release", op, assignable=False))

    # -- artifacts (issue 12) ----------------------------------------------------------------

    async def admit_artifact(self, ref: LeaseRef, name: str, size: int, *, max_attempt_bytes: int) -> None:
        """Check a commit before its chunks are read: the host's live lease, and the attempt's cap.

        Raises:
            NotFound, LeaseForeign, LeaseSuperseded, TaskTerminal, LeaseExpired, ArtifactQuotaExceeded.
        """

        async def op(conn: AsyncConnection, now: datetime) -> None:
            await artifacts.admit(conn, self.clock, ref, name, size, max_attempt_bytes)

        await self._tx.run(op, name="admit_artifact")

    async def record_artifact(
        self, ref: LeaseRef, artifact: ArtifactView, *, max_attempt_bytes: int
    ) -> tuple[ArtifactView, str | None]:
        """Record a stored object as an artifact (the checks of `admit_artifact` again, under the lock).

        Returns the row, and the object it replaced (the caller deletes it from the bucket), if any.
        """

        async def op(conn: AsyncConnection, now: datetime) -> tuple[ArtifactView, str | None]:
            return await artifacts.record(conn, self.clock, ref, artifact, max_attempt_bytes)

        return await self._tx.run(op, name="record_artifact")

    async def list_artifacts(self, task_id: uuid.UUID, attempt: int | None = None) -> tuple[ArtifactView, ...]:
        """The task's stored artifacts, by attempt then name (NotFound: no such task)."""

        async def op(conn: AsyncConnection, now: datetime) -> tuple[ArtifactView, ...]:
            return await artifacts.list_artifacts(conn, task_id, attempt)

        return await self._tx.run(op, name="list_artifacts")

    # -- health checks (issue 13) ------------------------------------------------------------

    async def set_health_check(
        self, name: str, labels: Mapping[str, str], plan: Mapping[str, Any], interval_s: float
    ) -> HealthCheckView:
        """Create or replace the health check `name` for the devices whose labels contain `labels`."""

        async def op(conn: AsyncConnection, now: datetime) -> HealthCheckView:
            return await healthchecks.set_check(conn, now, name, labels, plan, interval_s)

        return await self._tx.run(op, name="set_health_check")

    async def list_health_checks(self) -> tuple[HealthCheckView, ...]:
        """Every health check in force, by name."""

        async def op(conn: AsyncConnection, now: datetime) -> tuple[HealthCheckView, ...]:
            return await healthchecks.list_checks(conn)

        return await self._tx.run(op, name="list_health_checks")

    async def delete_health_check(self, name: str) -> HealthCheckView:
        """Remove the health check `name` (a row update); raises NotFound when none is in force."""

        async def op(conn: AsyncConnection, now: datetime) -> HealthCheckView:
            return await healthchecks.delete_check(conn, now, name)

        return await self._tx.run(op, name="delete_health_check")

    async def health_pass(self, *, limit: int = 100) -> tuple[int, int]:
        """Submit the health tasks of up to `limit` due devices, then place queued ones on their idle devices.

        Returns (devices that were due, health tasks placed). Statements that each commit on their own
        (`devsched.store.healthchecks`); several replicas may run it at once.
        """
        written: list[OutboxMessage] = []
        due = placed = 0

        async def run(db: Driver) -> None:
            nonlocal due, placed
            written.clear()
            due, placed = await healthchecks.create_due(db, self.clock, written, limit=limit), 0
            while placed < limit and await healthchecks.place_one(db, self.clock, written):
                placed += 1

        await self._tx.statements(run, name="health_pass")
        self._committed("health_pass", written, assignable=due > 0)
        return due, placed

    # -- scheduler and sweeper ---------------------------------------------------------------

    async def assign(self, *, limit: int = 200, device_limit: int = 2000) -> list[AttemptAssigned]:
        """Assign up to `limit` queued tasks to free matching devices; returns the new attempts."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> list[AttemptAssigned]:
            done = await assignment.assign(
                conn, now, changes.outbox, limit=limit, device_limit=device_limit, clock=self.clock
            )
            changes.assignable = not done.settled
            return done.assigned

        return await self._write("assign", op, assignable=False)

    async def sweep_expired(self, *, limit: int = 500) -> list[ExpiredLease]:
        """End up to `limit` expired leases: requeue, fail (`lease_expired`) or cancel their tasks."""

        async def op(conn: AsyncConnection, now: datetime, changes: _Changes) -> list[ExpiredLease]:
            expired = await sweeping.sweep_expired(
                conn, now, changes.outbox, limit=limit, device_grace_s=self.device_grace_s, clock=self.clock,
                quarantine_after=self.quarantine_after,
            )  # fmt: skip
            changes.assignable = bool(expired)  # requeued tasks, and devices free once their grace ends
            return expired

        return await self._write("sweep", op, assignable=False)

    async def sweep_timeouts(self, *, limit: int = 500) -> tuple[list[uuid.UUID], list[ExpiredLease]]:
        """Apply up to `limit` of each kind of time limit: (queued tasks failed, attempts ended).

        Queued tasks past their `queue_timeout_s` or `deadline` fail; attempts past their `attempt_timeout_s`
        or their task's `deadline` by a lease ttl (their host did not stop them) end, and their tasks fail, are
        retried by their policy, or are cancelled (a cancellation pending). One transaction.
        """

        async def op(
            conn: AsyncConnection, now: datetime, changes: _Changes
        ) -> tuple[list[uuid.UUID], list[ExpiredLease]]:
            failed = await timeouts.fail_queued(conn, now, changes.outbox, limit=limit, clock=self.clock)
            ended = await timeouts.end_overdue(
                conn, now, changes.outbox, limit=limit, device_grace_s=self.device_grace_s, clock=self.clock
            )
            changes.assignable = bool(ended)  # requeued tasks, and devices free once their grace ends
            return failed, ended

        return await self._write("sweep_timeouts", op, assignable=False)

    async def prune(self, keep: timedelta, *, limit: int = 1000) -> int:
        """Remove up to `limit` ended tasks older than `keep`, with all that is theirs; how many.

        Their attempts, reservations, cancellation requests and sent outbox rows go with them. One
        statement (the database's `devsched_prune`), so a batch is removed whole or not at all; several
        callers take different tasks (SKIP LOCKED).
        """

        async def run(db: Driver) -> int:
            return await pruning.prune(db, keep, limit)

        return await self._tx.statements(run, name="prune")

    async def relay_outbox(
        self,
        publish: outbox.PublishBatch,
        *,
        limit: int = 200,
        mark: Sequence[int] = (),
        skip: Sequence[int] = (),
        older_than_s: float | None = None,
    ) -> int:
        """Hand up to `limit` unsent outbox messages, in order, to `publish`; returns how many it published.

        One transaction: first `mark` (messages the caller published itself) are marked sent; then a
        batch of the others is claimed (other relays skip it) while `publish` runs, and the messages it
        acknowledged are marked sent when it returns. `skip` are messages the caller is publishing now;
        with `older_than_s`, messages younger than that are left to whoever wrote them.

        Raises:
            Exception: the error that stopped `publish`, after the messages it did publish were marked.
        """

        async def op(conn: AsyncConnection, now: datetime) -> outbox.Published:
            before = None if older_than_s is None else now - timedelta(seconds=older_than_s)
            return await outbox.relay(conn, now, publish, limit, mark=mark, skip=skip, before=before)

        outcome = await self._tx.run(op, name="relay")
        if outcome.error is not None:
            raise outcome.error
        return len(set(outcome.ids))

    async def unclaimed_assignments(
        self,
        *,
        host_id: str | None = None,
        older_than_s: float | None = None,
        online: bool = False,
        after: Unclaimed | None = None,
        limit: int = 500,
    ) -> list[Unclaimed]:
        """Attempts assigned and not yet claimed whose lease still runs, oldest first: to publish again.

        Read-only, one statement. `host_id` keeps one host's (it just registered); `older_than_s` those
        assigned at least that long ago, `online` those whose host is online (the scheduler's timer); `after`
        continues from the last one of the previous page.
        """

        async def op(conn: AsyncConnection, now: datetime) -> list[Unclaimed]:
            return await resync.unclaimed(
                conn, now, host_id=host_id, older_than_s=older_than_s, online=online, after=after, limit=limit
            )

        return await self._tx.run(op, name="unclaimed_assignments")

    async def unsent_count(self) -> int:
        """How many outbox messages wait to be published."""

        async def op(conn: AsyncConnection, now: datetime) -> int:
            return await outbox.unsent_count(conn)

        return await self._tx.run(op, name="unsent_count")

    # -- metrics -----------------------------------------------------------------------------

    async def gauges(self, grouping: stats.Grouping | None = None) -> stats.Gauges:
        """Queue depth and age by priority band, tasks by status, hosts, devices by state, the outbox's lag.

        A few aggregate statements (`devsched.store.stats`): for a periodic loop, not for every scrape. With
        `grouping`, the queue and the devices by the value of one label too.
        """

        async def op(conn: AsyncConnection, now: datetime) -> stats.Gauges:
            return await stats.gauges(conn, now, grouping)

        return await self._tx.run(op, name="gauges")

    async def starts(self, task_ids: Sequence[uuid.UUID], attempts: Sequence[tuple[uuid.UUID, int]]) -> stats.Starts:
        """When `task_ids` were submitted and `attempts` (task, attempt) assigned: where latencies start."""

        async def op(conn: AsyncConnection, now: datetime) -> stats.Starts:
            return await stats.starts(conn, task_ids, attempts)

        return await self._tx.run(op, name="starts")
