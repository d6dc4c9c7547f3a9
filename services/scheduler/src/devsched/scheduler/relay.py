"""The outbox relay: publish committed domain events to JetStream as the protocol's messages, then mark them.

A message reaches JetStream one of two ways:

- **At once.** The store hands this process the rows each of its transactions wrote, right after the
  commit (`offer`, the store's `on_commit`); they are published then, several in flight, and their ids
  wait to be marked sent, many in one transaction, by the next pass (`relay_mark_delay_s` later).
- **From the table.** A pass (`step`) claims unsent rows with SKIP LOCKED (several relays share the work,
  none waits on another), publishes them and marks the acknowledged ones: rows another process wrote (the
  sweeper), rows a process crashed on before publishing or marking them, publications that failed. A
  routine pass leaves rows younger than `relay_grace_s` to the process that wrote them; a full pass (the
  first one, one after the sweeper's wake-up, one after a failed publication) takes every row but this
  process's own in flight.

A crash before the mark commits publishes the messages again, and the stream's duplicate window drops the
copies by `Nats-Msg-Id`. What a message is on the wire (model, subject, stream, message id) is
`outgoing`'s to say.

When spans are exported, each publication is a PRODUCER span `publish <subject template>` in the trace
the row was stored with (the request that caused it, or the task's submit), ended at its acknowledgement;
the message carries that span's context, so the agent's processing of an assignment is its child.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NoStreamResponseError
from opentelemetry import trace

from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import ensure_streams
from devsched.scheduler.loops import Wakeup
from devsched.scheduler.outgoing import outgoing
from devsched.scheduler.settings import SchedulerSettings
from devsched.scheduler.spans import end_span, publish_headers, publish_span
from devsched.service import exporting_spans
from devsched.store import Committed, OutboxMessage, Published, Store
from devsched.store.faults import point

log = logging.getLogger("devsched.scheduler.relay")


class Relay:
    """Publishes what this process committed at once, and what nobody published from the table.

    `wakeup` is the wake-up of the loop that runs `step`: the relay uses it to have its marks written and
    failed publications retried.
    """

    def __init__(
        self,
        store: Store,
        js: JetStreamContext,
        subjects: Subjects,
        settings: SchedulerSettings,
        wakeup: Wakeup | None = None,
    ) -> None:
        self._store = store
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._wakeup = wakeup or Wakeup()
        #: Offered, not yet sent.
        self._offered: list[OutboxMessage] = []
        #: Offered ids from the offer until they are marked sent (or their publication failed).
        self._mine: set[int] = set()
        #: Published and acknowledged, waiting for the next pass to mark them sent.
        self._acked: list[int] = []
        self._full = True
        self._mark_timer: asyncio.TimerHandle | None = None
        self._ready = asyncio.Event()
        self._closing = False
        self._batches: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None
        self.published = 0
        self.duplicates = 0

    # -- at once, after the commit ---------------------------------------------------------------------

    def offer(self, committed: Committed) -> None:
        """Take the messages a transaction of this process just committed; they are published at once."""
        if not committed.messages:
            return
        self._offered.extend(committed.messages)
        self._mine.update(m.id for m in committed.messages)
        self._ready.set()

    def start(self) -> None:
        """Start publishing what is offered."""
        self._sender = asyncio.create_task(self._send_offered(), name="relay-sender")

    async def stop(self) -> None:
        """Publish what was offered and wait for its acknowledgements (the next pass marks them)."""
        self._closing = True
        self._ready.set()
        if self._sender is not None:
            await self._sender
            self._sender = None
        elif self._offered:
            await self._publish_offered()
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
        self._cancel_mark_timer()

    async def _send_offered(self) -> None:
        while not (self._closing and not self._offered):
            await self._ready.wait()
            self._ready.clear()
            if self._offered:
                await self._publish_offered()

    async def _publish_offered(self) -> None:
        batch, self._offered = self._offered, []
        try:
            sent = await self._send(batch)
            # the acknowledgements are awaited apart, so the next commit's messages go out meanwhile
            task = asyncio.create_task(self._settle_offered(batch, sent))
        except Exception:  # a bug: leave the batch to the table, keep publishing what comes next
            log.exception("publishing at once failed", extra={"count": len(batch)})
            self._failed([m.id for m in batch])
            return
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    def _failed(self, ids: list[int]) -> None:
        """Messages not published: the next pass (a full one, at once) takes them from the table."""
        self._mine.difference_update(ids)
        self._full = True
        self._wakeup.set()

    async def _settle_offered(self, batch: Sequence[OutboxMessage], sent: _Sent) -> None:
        outcome = await self._acknowledged(sent)
        if outcome.ids:
            point("relay.after_publish")  # published at once, not yet marked sent (the next pass marks)
        acked = set(outcome.ids)
        failed = [m.id for m in batch if m.id not in acked]
        self._acked.extend(outcome.ids)
        self.published += len(acked)
        if failed:
            log.info(
                "publication failed; the relay retries",
                extra={"count": len(failed), "error": type(outcome.error).__name__},
            )
            self._failed(failed)
        elif len(self._acked) >= self._settings.relay_batch:
            self._wakeup.set()
        elif self._mark_timer is None:
            loop = asyncio.get_running_loop()
            self._mark_timer = loop.call_later(self._settings.relay_mark_delay_s, self._mark_due)

    def _mark_due(self) -> None:
        self._mark_timer = None
        self._wakeup.set()

    def _cancel_mark_timer(self) -> None:
        if self._mark_timer is not None:
            self._mark_timer.cancel()
            self._mark_timer = None

    # -- publishing --------------------------------------------------------------------------------------

    async def _send(self, batch: Sequence[OutboxMessage]) -> _Sent:
        """Send every message of `batch` without waiting for acknowledgements, stopping at the first error."""
        futures: dict[asyncio.Future[PubAck], OutboxMessage] = {}
        spans: dict[asyncio.Future[PubAck], trace.Span] | None = {} if exporting_spans() else None
        for message in batch:
            span: trace.Span | None = None
            try:
                wire = outgoing(message.event, self._subjects, ref=message.id)
                data = wire.data
                if spans is not None:
                    span = publish_span(wire.subject, len(data), message.headers)
                headers = publish_headers(message.headers, wire.msg_id, span)
                future = await self._js.publish_async(
                    wire.subject,
                    data,
                    stream=wire.stream,  # never let another stream swallow it
                    headers=headers,
                )
            except Exception as exc:  # any failure: keep what was sent, retry the rest later
                if span is not None:
                    end_span(span, exc)
                return _Sent(futures, exc, spans)
            futures[future] = message
            if spans is not None and span is not None:
                spans[future] = span
        return _Sent(futures, spans=spans)

    async def _acknowledged(self, sent: _Sent) -> Published:
        """Wait (up to `publish_timeout_s`) for the acknowledgements of `sent`; what JetStream stored."""
        error = sent.error
        if not sent.futures:
            return Published((), error)
        done, pending = await asyncio.wait(sent.futures, timeout=self._settings.publish_timeout_s)
        for future in pending:
            future.cancel()
        if pending and error is None:
            error = TimeoutError(f"no acknowledgement within {self._settings.publish_timeout_s} s")
        if sent.spans:
            sent.end_spans(error)
        ids: list[int] = []
        for future in done:
            message = sent.futures[future]
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is not None:
                error = error or (exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                continue
            if future.result().duplicate:
                self.duplicates += 1
                log.info(
                    "already in the stream (republished after a crash)",
                    extra={"msg_id": outgoing(message.event, self._subjects, ref=message.id).msg_id},
                )
            ids.append(message.id)
        return Published(ids, error)

    async def publish_batch(self, batch: Sequence[OutboxMessage]) -> Published:
        """Publish a claimed batch, all in flight at once; says which JetStream acknowledged.

        Messages offered to this relay since the pass began are left to their own publication (which
        marks them): a full pass could otherwise claim a row committed while it ran and publish it twice.
        """
        return await self._acknowledged(await self._send([m for m in batch if m.id not in self._mine]))

    # -- from the table ----------------------------------------------------------------------------------

    def request_full_pass(self) -> None:
        """Have the next pass take every unsent row (another process wrote some: the sweeper's wake-up)."""
        self._full = True
        self._wakeup.set()

    async def step(self) -> bool:
        """Mark what was published at once; publish one batch from the table. True when there may be more."""
        mark, self._acked = self._acked, []
        full, self._full = self._full, False
        if mark:
            self._cancel_mark_timer()  # this pass marks them
        try:
            count = await self._store.relay_outbox(
                self.publish_batch,
                limit=self._settings.relay_batch,
                mark=mark,
                skip=sorted(self._mine),
                older_than_s=None if full else self._settings.relay_grace_s,
            )
        except NoStreamResponseError:
            self._retry(mark, full)
            # Nothing answered on the stream's subject: the stream was deleted under us.
            if self._settings.create_streams:
                log.warning("a stream is missing; creating it again")
                await ensure_streams(self._js, self._subjects, self._settings)
            raise
        except BaseException:
            self._retry(mark, full)
            raise
        self._mine.difference_update(mark)
        self.published += count
        if count:
            log.debug("relayed outbox messages", extra={"count": count, "marked": len(mark)})
        return count >= self._settings.relay_batch or len(self._acked) >= self._settings.relay_batch

    def _retry(self, mark: list[int], full: bool) -> None:
        # The pass failed (or its publisher did, after the marks committed: marking again changes nothing).
        self._acked = mark + self._acked
        self._full = self._full or full


class _Sent:
    """Messages handed to JetStream, by the future of each acknowledgement; the error that stopped sending.

    `spans`: the publication span of each message, when spans are exported.
    """

    __slots__ = ("error", "futures", "spans")

    def __init__(
        self,
        futures: dict[asyncio.Future[PubAck], OutboxMessage],
        error: Exception | None = None,
        spans: dict[asyncio.Future[PubAck], trace.Span] | None = None,
    ) -> None:
        self.futures = futures
        self.error = error
        self.spans = spans

    def end_spans(self, error: Exception | None) -> None:
        """End each publication's span as its acknowledgement came (or did not: `error`)."""
        for future, span in (self.spans or {}).items():
            end_span(span, (error or TimeoutError("no acknowledgement")) if future.cancelled() else future.exception())
