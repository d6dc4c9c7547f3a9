"""The one JetStream reader: every read of a stream opens its ordered consumer here.

The CLI's `watch`, `logs` and `artifacts get` and the dashboard's task page, live log and downloads read
stored events, step output and artifact chunks through `JetStreamReader.open`, with one configuration:

- **Named, its filter in the create request.** Each host's step output is a stream of its own
  (`<PU>_LOGS_<host_id>`), and a NATS permission cannot name every such stream: a subject token is
  matched whole. A named consumer is created with `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`,
  and the server refuses one whose configured filter is not the subject's (10131), so the deploy
  accounts' `$JS.API.CONSUMER.CREATE.*.*.P.host.*.log.>` lets operators and the dashboard read log
  subjects and nothing else. The events stream and the artifacts bucket are granted `<stream>.>`,
  which these names fit too.
- **Ordered:** flow control, an idle heartbeat every `IDLE_HEARTBEAT_S`, no acks, in memory, one replica,
  from the first message the stream holds for the subject. nats-py makes the consumer again, from the
  next stream sequence, when a delivery skips one (a gap) or two heartbeats go missing; that goes through
  this module's manager as well, which gives each creation a fresh name (`NAME_PREFIX` and a NUID), so
  the new request names its filter too.
- **Torn down** by `Ordered.close`: the subscription goes, with its heartbeat and flow-control tasks. No
  delete request is sent (the accounts grant none on the logs streams): the server deletes a consumer
  nobody has listened to for `INACTIVE_THRESHOLD_S`, the default it gives ephemeral consumers.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import TracebackType
from typing import Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.manager import JetStreamManager

from devsched.client.errors import NatsUnreachable, Unavailable

#: The first characters of a reader consumer's name; the rest is a NUID.
NAME_PREFIX = "devsched-reader-"
#: Seconds without a subscriber after which the server deletes a reader's consumer.
INACTIVE_THRESHOLD_S = 5.0
#: Seconds between the server's idle heartbeats (two missed make nats-py recreate the consumer).
IDLE_HEARTBEAT_S = 5.0


class StreamMissing(Unavailable):
    """The stream to read does not exist."""


class _FreshNames(JetStreamManager):
    """Gives each reader consumer a new name at every creation (the first, and each after a gap)."""

    def __init__(self, nc: NatsClient, prefix: str, timeout: float) -> None:
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


class _NamingContext(JetStreamContext):
    """A JetStream context whose consumers are created through `_FreshNames`."""

    @property
    def _jsm(self) -> JetStreamManager:
        return _FreshNames(self._nc, self._prefix, self._timeout)


class Ordered:
    """One ordered consumer of one subject: its stored messages, then what comes, until `close`.

    Use it as `async with await reader.open(stream, subject) as ordered: ...`, which tears it down
    however the block is left.
    """

    def __init__(self, sub: JetStreamContext.PushSubscription, stored: int) -> None:
        self._sub: JetStreamContext.PushSubscription | None = sub
        #: How many messages the stream held for the subject when the consumer was made.
        self.stored = stored

    @property
    def consumer(self) -> str | None:
        """The consumer's name now (a new one each time it is made again); None once closed."""
        return self._sub._consumer if self._sub is not None else None

    async def next(self, wait: float) -> Msg | None:
        """The next message, or None when none came within `wait` seconds (a quiet stream is no error).

        Raises:
            NatsUnreachable: the connection failed, or the consumer was closed.
        """
        if self._sub is None:
            raise NatsUnreachable("the reader is closed")
        try:
            return await self._sub.next_msg(timeout=wait)
        except nats.errors.TimeoutError:
            return None
        except nats.errors.Error as exc:
            raise NatsUnreachable(f"reading a stream failed: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        """Unsubscribe (the server deletes the consumer soon after); idempotent."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


class JetStreamReader:
    """Opens the ordered consumers of one connection (see the module docstring)."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = _NamingContext(js._nc, prefix=js._prefix, timeout=js._timeout)

    async def open(self, stream: str, subject: str) -> Ordered:
        """An ordered consumer of `subject` in `stream`, from the first message the stream holds for it.

        Raises:
            StreamMissing: no such stream.
            NatsUnreachable: NATS refused the consumer or cannot be reached.
        """
        config = ConsumerConfig(
            name=NAME_PREFIX,  # `_FreshNames` completes it at each creation
            filter_subject=subject,
            deliver_subject=self._js._nc.new_inbox(),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=IDLE_HEARTBEAT_S,
            inactive_threshold=INACTIVE_THRESHOLD_S,
            num_replicas=1,
            mem_storage=True,
        )
        try:
            info = await self._js._jsm.add_consumer(stream, config)
            sub = await self._js.subscribe_bind(
                stream, dataclasses.replace(config, name=info.name), info.name, ordered_consumer=True
            )
        except nats.js.errors.NotFoundError:
            raise StreamMissing(f"the stream {stream} does not exist", stream=stream) from None
        except (nats.errors.Error, OSError) as exc:
            raise NatsUnreachable(f"cannot read the stream {stream}: {type(exc).__name__}: {exc}") from None
        return Ordered(sub, info.num_pending or 0)

    async def stored(self, stream: str, subject: str, *, wait: float, most: int) -> list[Msg]:
        """The messages the stream holds for `subject` now (at most `most`), without waiting for more.

        The read ends when the stream says none is pending, or after `wait` seconds of quiet (messages
        that aged out while it read).

        Raises:
            StreamMissing, NatsUnreachable: as `open`.
        """
        found: list[Msg] = []
        async with await self.open(stream, subject) as ordered:
            if ordered.stored == 0:
                return found
            while len(found) < most:
                msg = await ordered.next(wait)
                if msg is None:
                    break
                found.append(msg)
                if msg.metadata.num_pending == 0:
                    break
        return found


__all__ = ["IDLE_HEARTBEAT_S", "INACTIVE_THRESHOLD_S", "NAME_PREFIX", "JetStreamReader", "Ordered", "StreamMissing"]
