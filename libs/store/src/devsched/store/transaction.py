"""One choke point for every repository call: typed errors, retries, safe cancellation, a span.

An operation runs in one transaction, or as statements that are each whole by themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import TypeVar

import asyncpg  # type: ignore[import-untyped]
import sqlalchemy.exc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from devsched.core.errors import DevschedError, Internal, InvalidRequest, Unavailable
from devsched.store.clock import Clock
from devsched.store.driver import Driver

T = TypeVar("T")
Operation = Callable[[AsyncConnection, datetime], Awaitable[T]]
#: An operation of statements that each commit on their own (no transaction around them), run through the
#: driver; they read the clock inline (`devsched.store.clock.NOW`).
Statements = Callable[[Driver], Awaitable[T]]
#: Told of every operation run: its name and how long it took in seconds, retries included (for metrics).
OperationHook = Callable[[str, float], None]

log = logging.getLogger("devsched.store")

#: The tracer of the operations' spans (a proxy: it follows the provider a service installs later).
_TRACER = trace.get_tracer("devsched.store")

#: Serialization failure, deadlock: the transaction lost a race and can simply run again.
_RETRY_STATES = frozenset({"40001", "40P01"})
#: Unique indexes that two racing writers can both pass the reads of; the loser runs again and then
#: sees the winner's row (an idempotency key already used, a device or task already reserved).
_RETRY_CONSTRAINTS = frozenset(
    {
        "uq_tasks_idempotency_key",
        "uq_attempts_one_active_per_device",
        "uq_attempts_one_active_per_task",
        "pk_attempts",
        "pk_cancel_requests",
        "hosts_pkey",
        "devices_pkey",
        # another host's registration racing the owner's first one: run again, it then meets the owner's row
        "tg_devices_owner_kept",
    }
)
#: The connection itself failed (or the server shut down): after a COMMIT was sent, its outcome is unknown.
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03", "08000", "08003", "08006"})
#: Query cancelled by statement_timeout, lock_timeout, or the server going away: nothing was applied.
_UNAVAILABLE_STATES = frozenset({"57014", "55P03", "57P01", "57P02", "57P03", "53300", "08000", "08003", "08006"})


def _pg_details(exc: sqlalchemy.exc.DBAPIError) -> tuple[str | None, str | None]:
    """(sqlstate, constraint name) of the driver error behind `exc`, where the driver gives them."""
    # SQLAlchemy's adapted error carries the sqlstate; the asyncpg error behind it also the constraint.
    candidates = (exc.orig, getattr(exc.orig, "__cause__", None))
    states = [s for c in candidates if (s := getattr(c, "sqlstate", None))]
    constraints = [n for c in candidates if (n := getattr(c, "constraint_name", None))]
    return (str(states[0]) if states else None), (str(constraints[0]) if constraints else None)


class Transactor:
    """Runs an operation, translating driver errors into `DevschedError`s.

    In one transaction (`run`) or as statements that each commit on their own (`statements`). In a
    transaction, `now` is read from the clock inside it and handed to the operation, so every rule
    sees one consistent time per operation; statements read the clock themselves (`clock.NOW`).
    """

    def __init__(self, engine: AsyncEngine, clock: Clock, *, attempts: int = 5) -> None:
        self._engine = engine
        self._clock = clock
        self._attempts = attempts
        #: See `OperationHook`; called however the operation ended, and must not raise.
        self.on_operation: OperationHook | None = None

    async def run(self, op: Operation[T], *, name: str) -> T:
        """Run `op` in one transaction to completion even if the caller is cancelled meanwhile.

        A `CancelledError` delivered inside `execute` can hand a broken connection back to the pool
        (SQLAlchemy issues 6592, 6652, 8145). The transaction therefore runs in its own task, shielded;
        a cancelled caller waits for it to commit or roll back (bounded by the statement timeout) and
        then sees the cancellation.
        """
        work = self._with_retries(self._transaction(op), name)
        if trace.get_current_span().is_recording():
            return await self._traced(name, work)
        return await self._shielded(work, name)

    async def statements(self, op: Statements[T], *, name: str) -> T:
        """Run `op` on a pooled connection through the driver, without a transaction around it.

        For operations that are one statement (or several, each whole by itself): BEGIN, COMMIT and a
        read of the clock would be three more round trips (`devsched.store.driver` says why the driver).
        Each statement of `op` must be safe to run again: a lost connection runs `op` again (a renewal
        extends again, a report finds itself recorded, a submit finds its own task id). Errors, other
        retries and cancellation as in `run`.
        """
        work = self._with_retries(self._statements(op), name)
        if trace.get_current_span().is_recording():
            return await self._traced(name, work)
        return await self._shielded(work, name)

    async def _traced(self, name: str, work: Coroutine[object, None, T]) -> T:
        """Run `work` shielded and timed in a span of its own named `name` (the caller's span is recorded).

        Only then: a span that exports nothing (tracing off, a `PropagatingTracerProvider`) would cost every
        operation its id and context for nothing, and an operation outside any recorded work (a relay
        pass, a health check) would make a trace of one span every tick.
        """
        attributes = {"db.system.name": "postgresql", "db.operation.name": name}
        with _TRACER.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                return await self._shielded(work, name)
            except DevschedError as exc:  # a refusal (409, 404) is an answer; only a failure is an error
                span.set_attribute("error.type", exc.code)
                if exc.status >= 500:
                    span.set_status(Status(StatusCode.ERROR, exc.code))
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    async def _shielded(self, work: Coroutine[object, None, T], name: str) -> T:
        """Run `work` in a task of its own, shielded from the caller's cancellation (see `run`), and timed.

        The task is the price of that safety (about 10 us an operation): a cancellation delivered while
        asyncpg awaits the server would leave its connection mid-protocol.
        """
        task = asyncio.ensure_future(work)
        started = time.perf_counter()
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved, so it is not logged as never retrieved
            raise
        finally:
            if (hook := self.on_operation) is not None:
                hook(name, time.perf_counter() - started)

    def _transaction(self, op: Operation[T]) -> Callable[[], Awaitable[T]]:
        async def once() -> T:
            started = committing = False
            try:
                async with self._engine.begin() as conn:
                    now = await self._clock.now(conn)
                    started = True
                    result = await op(conn, now)
                    committing = True
                return result
            except (sqlalchemy.exc.DBAPIError, OSError) as exc:
                if committing and _lost(exc):
                    # The COMMIT went out and its answer did not come back: the change may or may not be
                    # in the database, and nothing here can tell. Say so instead of "nothing changed".
                    raise Unavailable(
                        "the connection to the database was lost while committing: the change may have been "
                        "applied; repeat the request (with the same idempotency key) to find out",
                        outcome="unknown",
                    ) from exc
                if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated and not started:
                    # a pooled connection that died (database restart): nothing ran, so run again on a new one
                    raise _Retry("stale pooled connection") from exc
                raise

        return once

    def _statements(self, op: Statements[T]) -> Callable[[], Awaitable[T]]:
        async def once() -> T:
            pooled = await self._engine.raw_connection()
            driver = Driver(pooled.driver_connection)
            try:
                return await op(driver)
            except BaseException as exc:
                if driver.closed or isinstance(exc, OSError):
                    pooled.invalidate(exc if isinstance(exc, Exception) else None)
                    if isinstance(exc, Exception):
                        # a pooled connection that died (database restart), or a statement whose answer
                        # was lost: `op` may run again (see `statements`)
                        raise _Retry("connection lost", ambiguous=True) from exc
                raise
            finally:
                if pooled.is_valid:
                    pooled.close()

        return once

    async def _with_retries(self, once: Callable[[], Awaitable[T]], name: str) -> T:
        for attempt in range(1, self._attempts + 1):
            try:
                try:  # translated here, not in a coroutine of its own: one frame fewer per operation
                    return await once()
                except DevschedError:
                    raise
                except Exception as exc:
                    translated = _translated(exc)
                    if translated is exc:
                        raise
                    raise translated from exc
            except _Retry as retry:
                if attempt == self._attempts:
                    if retry.ambiguous:  # the last statement sent may have been applied
                        raise Unavailable(
                            f"{name}: the connection to the database was lost {attempt} times; the change may "
                            "have been applied",
                            outcome="unknown",
                        ) from retry
                    raise Unavailable(f"{name}: gave up after {attempt} conflicting attempts") from retry
                log.debug("retrying %s after %s", name, retry)
                trace.get_current_span().add_event("retry", {"reason": str(retry), "attempt": attempt})
                await asyncio.sleep(0.005 * attempt)
        raise AssertionError("unreachable")


def _translated(exc: Exception) -> Exception:
    """The `DevschedError` (or `_Retry`) of an error from the driver; `exc` itself when it is none of its."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return _translate(*_pg_details(exc), lost=exc.connection_invalidated, orig=exc.orig)
    if isinstance(exc, asyncpg.PostgresError):
        return _translate(exc.sqlstate, exc.constraint_name, lost=False, orig=exc)
    if isinstance(exc, (OSError, TimeoutError, sqlalchemy.exc.TimeoutError)):
        return Unavailable(f"database unreachable: {exc.__class__.__name__}")
    if isinstance(exc, (sqlalchemy.exc.SQLAlchemyError, asyncpg.InterfaceError)):
        log.exception("unexpected database error")
        return Internal()
    return exc


class _Retry(Exception):
    """The transaction lost a benign race; run it again.

    `ambiguous`: what was sent may have been applied (a statement whose answer was lost), so giving up
    must not claim that nothing changed.
    """

    def __init__(self, why: str, *, ambiguous: bool = False) -> None:
        super().__init__(why)
        self.ambiguous = ambiguous


def _lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection went away (rather than the server refusing the COMMIT)."""
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        state, _ = _pg_details(exc)
        return exc.connection_invalidated or state is None or state in _CONNECTION_STATES
    return False


def _translate(state: str | None, constraint: str | None, *, lost: bool, orig: object) -> Exception:
    """The error for a driver error with this sqlstate and constraint (`lost`: its connection died)."""
    if state in _RETRY_STATES or (state == "23505" and constraint in _RETRY_CONSTRAINTS):
        return _Retry(f"{state} {constraint or ''}".strip())
    if lost or state in _UNAVAILABLE_STATES or state is None:
        return Unavailable(f"database unavailable ({state or orig.__class__.__name__})")
    if state in ("23514", "22001", "22003", "22P02", "23502"):
        return InvalidRequest(f"rejected by the database: {state}", constraint=constraint)
    log.error("database error %s on constraint %s: %s", state, constraint, orig)
    return Internal()
