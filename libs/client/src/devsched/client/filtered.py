"""Ordered consumers whose creation names their filter subject, so a NATS permission can confine them.

Each host's step output is a stream of its own (`<PU>_LOGS_<host_id>`), and a permission cannot name every
such stream: a subject token is matched whole. JetStream's create request
`$JS.API.CONSUMER.CREATE.<stream>.<consumer>.<filter>` carries the filter, and the server refuses a
consumer whose configured filter is not that one; so `$JS.API.CONSUMER.CREATE.*.*.P.host.*.log.>` lets
an operator read the log subjects of any stream and nothing else. nats-py names the filter in the subject
only for a named consumer, and an ordered consumer that restarts (after a gap or a lost heartbeat) makes its
consumer again with the same request: `FilteredJetStream` gives each creation a new name.
"""

from __future__ import annotations

import dataclasses

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.manager import JetStreamManager

#: The first characters of the names this module gives; the rest is a NUID.
NAME_PREFIX = "devsched-reader-"
#: Seconds without a subscriber after which the server deletes a reader's consumer (nobody needs to).
INACTIVE_THRESHOLD_S = 30.0


class _FreshNames(JetStreamManager):
    def __init__(self, nc: Client, prefix: str, timeout: float) -> None:
        super().__init__(nc, prefix, timeout)
        self._client = nc

    async def add_consumer(
        self,
        stream: str,
        config: ConsumerConfig | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the signature of the method overridden
        **params: object,
    ) -> ConsumerInfo:
        if config is not None and (config.name or "").startswith(NAME_PREFIX):
            config.name = NAME_PREFIX + self._client._nuid.next().decode()
        return await super().add_consumer(stream, config, timeout, **params)


class FilteredJetStream(JetStreamContext):
    """A JetStream context whose reader consumers are created by name, their filter in the request subject."""

    @property
    def _jsm(self) -> JetStreamManager:
        return _FreshNames(self._nc, self._prefix, self._timeout)

    @classmethod
    def like(cls, js: JetStreamContext) -> FilteredJetStream:
        """A context with the connection, API prefix and timeout of `js`."""
        return cls(js._nc, prefix=js._prefix, timeout=js._timeout)

    async def ordered(self, stream: str, subject: str) -> tuple[JetStreamContext.PushSubscription, int]:
        """An ordered consumer of `subject` in `stream` from its first message, and how many it holds now.

        Raises:
            nats.js.errors.NotFoundError: no such stream.
            nats.errors.Error: NATS refused or is unreachable.
        """
        config = ConsumerConfig(
            name=NAME_PREFIX,  # a new name is given at each creation
            filter_subject=subject,
            deliver_subject=self._nc.new_inbox(),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=5.0,
            inactive_threshold=INACTIVE_THRESHOLD_S,
            num_replicas=1,
            mem_storage=True,
        )
        info = await self._jsm.add_consumer(stream, config)
        sub = await self.subscribe_bind(
            stream, dataclasses.replace(config, name=info.name), info.name, ordered_consumer=True
        )
        return sub, info.num_pending or 0
