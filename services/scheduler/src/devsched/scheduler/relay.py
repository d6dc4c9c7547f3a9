"""The outbox relay: publish committed domain events to JetStream as the protocol's messages, then mark them.

The store claims a batch of unsent rows with SKIP LOCKED (several relays share the work, none waits on
another) and marks only the messages this relay reports as acknowledged by JetStream: a crash before
the mark commits republishes them, and the stream's duplicate window drops the copies by `Nats-Msg-Id`.
What a message is on the wire (model, subject, stream, message id) is `outgoing`'s to say.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from devsched.core.events import DomainEvent
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects
from devsched.scheduler.jetstream import ensure_streams
from devsched.scheduler.outgoing import outgoing
from devsched.scheduler.settings import SchedulerSettings
from devsched.store import OutboxMessage, Published, Store

log = logging.getLogger("devsched.scheduler.relay")


class Relay:
    """One pass publishes up to a batch of unsent outbox messages, in id order."""

    def __init__(self, store: Store, js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings) -> None:
        self._store = store
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self.published = 0
        self.duplicates = 0

    async def publish(self, event: DomainEvent, headers: Mapping[str, str]) -> None:
        """Publish one domain event with its trace `headers` and wait for JetStream's ack.

        Raises:
            Exception: no ack (timeout, no stream, connection lost), or the event makes no valid message.
        """
        message = outgoing(event, self._subjects)
        ack = await self._js.publish(
            message.subject,
            message.data,
            timeout=self._settings.publish_timeout_s,
            stream=message.stream,  # never let another stream swallow it
            headers={**headers, MSG_ID_HEADER: message.msg_id},
        )
        if ack.duplicate:
            self.duplicates += 1
            log.info("already in the stream (republished after a crash)", extra={"msg_id": message.msg_id})

    async def publish_batch(self, batch: Sequence[OutboxMessage]) -> Published:
        """Publish a claimed batch one message at a time, stopping at the first failure."""
        sent: list[int] = []
        for message in batch:
            try:
                await self.publish(message.event, message.headers)
            except Exception as exc:  # any failure: keep what was sent, retry the rest later, in order
                return Published(sent, exc)
            sent.append(message.id)
        return Published(sent)

    async def step(self) -> bool:
        """Publish one batch; True when the batch was full (more may wait)."""
        try:
            count = await self._store.relay_outbox(self.publish_batch, limit=self._settings.relay_batch)
        except NoStreamResponseError:
            # Nothing answered on the stream's subject: the stream was deleted under us.
            if self._settings.create_streams:
                log.warning("a stream is missing; creating it again")
                await ensure_streams(self._js, self._subjects, self._settings)
            raise
        self.published += count
        if count:
            log.debug("relayed outbox messages", extra={"count": count})
        return count >= self._settings.relay_batch
