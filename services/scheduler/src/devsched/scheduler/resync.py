"""The resync: assignments of attempts still unclaimed, read back from the database and published again.

The relay publishes an attempt's assignment once. If JetStream loses it (the stream purged, NATS's store
lost, its deliveries spent while the host was away), nothing else would reach the host, the lease would
run out and the sweeper would spend one of the task's attempts. So the assignments of attempts that are
assigned, unclaimed and unexpired are published again:

- by a timer pass (`step`, every `resync_interval_s`): attempts on online hosts unclaimed for at least
  `resync_after_s`;
- when a host registers (`host_registered`, once its consumer exists): that host's attempts assigned
  at least `REGISTERED_MIN_AGE_S` ago (those the registration itself just assigned are on their way through
  the outbox: a copy would only make the agent drop a duplicate).

A copy goes to `P.assign.<host_id>` under a message id of its own (`outgoing.resent`), best effort:
nothing is marked, and a copy that did not go out is published by a later pass if the attempt is still
unclaimed then. The agent acks and drops a copy of an attempt it took already. Each timer pass also
creates the streams again if they are missing (NATS lost its store), and makes sure the consumer of each
host it publishes to exists (a lost store took them too), so neither waits for a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable

from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NoStreamResponseError, NotFoundError
from opentelemetry import trace

from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import JETSTREAM_ERRORS, ensure_host_consumer, ensure_streams
from devsched.scheduler.outgoing import Outgoing, resent
from devsched.scheduler.settings import SchedulerSettings
from devsched.scheduler.spans import end_span, publish_headers, publish_span
from devsched.service import exporting_spans
from devsched.store import Store, Unclaimed

log = logging.getLogger("devsched.scheduler.resync")

#: Attempts read (and published) at a time.
PAGE = 200
#: How old an attempt must be for a registration to publish it again (seconds).
REGISTERED_MIN_AGE_S = 1.0


class Resync:
    """Publishes the assignments of unclaimed attempts again: on a timer, and when their host registers."""

    def __init__(self, store: Store, js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings) -> None:
        self._store = store
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._background: set[asyncio.Task[None]] = set()
        #: Copies JetStream acknowledged.
        self.resent = 0

    async def step(self) -> bool:
        """The timer's pass: streams checked, then attempts on online hosts unclaimed for `resync_after_s`."""
        if self._settings.create_streams:
            await self._recreate_missing_streams()
        async for page in self._pages(older_than_s=self._settings.resync_after_s, online=True):
            await self._ensure_consumers({u.assignment.host_id for u in page})
            await self._publish(page, trigger="timer")
        return False

    def host_registered(self, host_id: str) -> None:
        """Publish the host's unclaimed assignments again, in the background (its consumer exists now)."""
        task = asyncio.create_task(self._resend_host(host_id), name=f"resync-{host_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        """Let the publications started by registrations finish (up to `publish_timeout_s`)."""
        if not self._background:
            return
        _, pending = await asyncio.wait(set(self._background), timeout=self._settings.publish_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _resend_host(self, host_id: str) -> None:
        try:
            async for page in self._pages(host_id=host_id, older_than_s=REGISTERED_MIN_AGE_S):
                await self._publish(page, trigger="registered")
        except Exception as exc:  # best effort: the timer's pass publishes them later
            log.warning(
                "assignments not resent after a registration: %s", type(exc).__name__, extra={"host_id": host_id}
            )

    async def _pages(
        self, *, host_id: str | None = None, older_than_s: float | None = None, online: bool = False
    ) -> AsyncIterator[list[Unclaimed]]:
        after: Unclaimed | None = None
        while True:
            page = await self._store.unclaimed_assignments(
                host_id=host_id, older_than_s=older_than_s, online=online, after=after, limit=PAGE
            )
            if page:
                yield page
            if len(page) < PAGE:
                return
            after = page[-1]

    async def _recreate_missing_streams(self) -> None:
        missing = []
        for name in (self._subjects.assignments_stream, self._subjects.events_stream):
            try:
                await self._js.stream_info(name)
            except NotFoundError:
                missing.append(name)
            except JETSTREAM_ERRORS as exc:  # JetStream unavailable (NATS restarting): the next pass looks again
                log.info("streams not checked: %s", type(exc).__name__)
                return
        if missing:
            log.warning("streams missing (NATS lost its store?); creating them again", extra={"streams": missing})
            await ensure_streams(self._js, self._subjects, self._settings)

    async def _ensure_consumers(self, hosts: Iterable[str]) -> None:
        for host_id in sorted(hosts):
            try:
                await ensure_host_consumer(self._js, self._subjects, self._settings, host_id)
            except JETSTREAM_ERRORS as exc:  # its copies wait in the stream until its next registration
                log.info("host consumer not ensured: %s", type(exc).__name__, extra={"host_id": host_id})

    async def _publish(self, page: list[Unclaimed], *, trigger: str) -> None:
        """Publish `page` again, all in flight at once; log each copy sent, acknowledged or not."""
        at_ms = time.time_ns() // 1_000_000
        sent: dict[asyncio.Future[PubAck], tuple[Unclaimed, Outgoing]] = {}
        unsent: list[Unclaimed] = []  # never sent: `failure` stopped the rest of the page
        failure: Exception | None = None
        spans: dict[asyncio.Future[PubAck], trace.Span] | None = {} if exporting_spans() else None
        for i, u in enumerate(page):
            try:
                wire = resent(u.assignment, self._subjects, at_ms)
            except ValueError as exc:  # not a valid message (the relay would have refused it too): a bug
                log.error("assignment cannot be published again", extra={**_ids(u), "error": str(exc)})
                continue
            data = wire.data
            span = publish_span(wire.subject, len(data), u.headers) if spans is not None else None
            try:
                future = await self._js.publish_async(
                    wire.subject, data, stream=wire.stream, headers=publish_headers(u.headers, wire.msg_id, span)
                )
            except Exception as exc:  # NATS is away: the rest waits for the next pass
                if span is not None:
                    end_span(span, exc)
                unsent, failure = page[i:], exc
                break
            sent[future] = (u, wire)
            if spans is not None and span is not None:
                spans[future] = span
        if sent:
            _, pending = await asyncio.wait(sent, timeout=self._settings.publish_timeout_s)
            for future in pending:
                future.cancel()
        missing_stream = False
        for future, (u, wire) in sent.items():
            error = _error_of(future)
            if spans is not None:
                end_span(spans[future], error)
            fields = {**_ids(u), "msg_id": wire.msg_id, "trigger": trigger}
            if error is None:
                self.resent += 1
                log.info("assignment resent", extra=fields)
            else:
                missing_stream = missing_stream or isinstance(error, NoStreamResponseError)
                log.info("assignment not resent", extra={**fields, "sent": True, "error": type(error).__name__})
        if unsent:  # one line: NATS is away, and every one of them would fail the same way
            fields = {**_ids(unsent[0]), "trigger": trigger, "sent": False, "count": len(unsent)}
            log.info("assignments not resent: %s", type(failure).__name__, extra=fields)
        if missing_stream and self._settings.create_streams:
            log.warning("the assignments stream is missing; creating it again")
            await ensure_streams(self._js, self._subjects, self._settings)


def _ids(u: Unclaimed) -> dict[str, object]:
    a = u.assignment
    return {
        "task_id": str(a.task_id),
        "attempt": a.attempt,
        "lease_id": str(a.lease_id),
        "host_id": a.host_id,
        "device_id": a.device_id,
    }


def _error_of(future: asyncio.Future[PubAck]) -> BaseException | None:
    """Why a publication was not acknowledged, or None if it was."""
    if future.cancelled():
        return TimeoutError("no acknowledgement in time")
    return future.exception()
