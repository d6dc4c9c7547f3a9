"""The outbox relay: publish committed outbox rows to JetStream, then mark them sent.

The store claims unsent rows with SKIP LOCKED (several relays share the work, none waits on another)
and marks a row only after our publish returned, which is after JetStream's publish ack: a crash before
the mark commits republishes the row, and the stream's duplicate window drops the copy by `Nats-Msg-Id`.
"""

from __future__ import annotations

import json
import logging

from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import ensure_streams
from devsched.scheduler.settings import SchedulerSettings
from devsched.store import OutboxMessage, Store

log = logging.getLogger("devsched.scheduler.relay")

MSG_ID_HEADER = "Nats-Msg-Id"


class Relay:
    """One pass publishes up to a batch of unsent rows, in id order."""

    def __init__(self, store: Store, js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings) -> None:
        self._store = store
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._assign_prefix = f"{subjects.prefix}.assign."
        self.published = 0
        self.duplicates = 0

    def _stream_of(self, subject: str) -> str:
        if subject.startswith(self._assign_prefix):
            return self._subjects.assignments_stream
        return self._subjects.events_stream

    async def publish(self, message: OutboxMessage) -> None:
        """Publish one row and wait for JetStream's ack (raises if there is none)."""
        headers = {**message.headers, MSG_ID_HEADER: message.msg_id}
        ack = await self._js.publish(
            message.subject,
            json.dumps(message.payload, separators=(",", ":")).encode(),
            timeout=self._settings.publish_timeout_s,
            stream=self._stream_of(message.subject),  # never let another stream swallow it
            headers=headers,
        )
        if ack.duplicate:
            self.duplicates += 1
            log.info("already in the stream (republished after a crash)", extra={"msg_id": message.msg_id})

    async def step(self) -> bool:
        """Publish one batch; True when the batch was full (more may wait)."""
        try:
            count = await self._store.relay_outbox(self.publish, limit=self._settings.relay_batch)
        except NoStreamResponseError:
            # Nothing answered on the stream's subject: the stream was deleted under us.
            if self._settings.create_streams:
                log.warning("a stream is missing; creating it again")
                await ensure_streams(self._js, self._subjects, self._settings)
            raise
        self.published += count
        if count:
            log.debug("relayed outbox rows", extra={"count": count})
        return count >= self._settings.relay_batch
