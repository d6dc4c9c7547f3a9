"""What the agent takes in from the scheduler: assignments from its durable consumer, nudges and drain notices.

The pull consumer `host-<host_id>` is created by the scheduler when the host registers, so binding is
retried (re-registering now and then while it is missing). Each fetched assignment goes to its device's
worker (`Sink.offer`) and is kept from redelivery with `in_progress` until the worker settles it: acked
once claimed or found stale, given back (released) if the agent stops before it runs. A duplicate delivery of
an attempt this agent already took (a redelivery, or the scheduler's resync publishing it again) is acked
and dropped: a repeated claim of the same lease succeeds, so only this check keeps one attempt from running
twice. The attempts remembered include those taken before the agent last started (`taken.py`). An
assignment for a device this host does not have is acked and dropped too: its lease expires and the
sweeper requeues the task, which beats failing it.

The nudge subject also carries the scheduler's drain notice for this host (`P.api.hosts.drain`): the agent
then finishes its running work, takes no more, and exits once idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from devsched.agent.attempt import AttemptKey
from devsched.core.backoff import backoff_delay
from devsched.core.errors import InvalidRequest
from devsched.core.leases import Extension
from devsched.protocol import messages as wire
from devsched.protocol.codec import decode
from devsched.protocol.subjects import Subjects
from devsched.service import sleep_or_stop

logger = logging.getLogger(__name__)

#: How long one pull waits for assignments.
FETCH_WAIT_S = 5.0
#: Attempt keys remembered to drop duplicate deliveries.
REMEMBERED_ATTEMPTS = 4096


async def settle(ack: Awaitable[None]) -> None:
    """Await an ack/nak/term/in_progress, ignoring failures: JetStream redelivers what was not settled."""
    with contextlib.suppress(Exception):
        await ack


@dataclass(slots=True)
class Received:
    """An assignment as received: its message, kept in progress until settled, and when it arrived.

    Or an attempt a report's reply handed over already dispatched (`handed`, the grant its claim would have
    given): no message then, nothing to settle, and no claim.
    """

    msg: Msg | None
    assignment: wire.Assignment
    keepalive: asyncio.Task[None] | None
    #: Monotonic; the claim deadline counts from here, not from when a busy device got round to it. For an
    #: attempt handed over: when the report whose reply handed it was sent (its lease runs from then).
    received_at: float
    handed: Extension | None = None

    async def ack(self) -> None:
        """Settle its message (an attempt handed over has none)."""
        if self.msg is not None:
            await settle(self.msg.ack())

    def stop_keepalive(self) -> None:
        """Stop keeping its message in progress."""
        if self.keepalive is not None:
            self.keepalive.cancel()


class Sink(Protocol):
    """Where the intake hands what it takes in (the device workers)."""

    def has_device(self, device_id: str) -> bool:
        """Whether this host has the device."""
        ...

    def offer(self, received: Received) -> None:
        """Queue an assignment for its device."""
        ...

    def nudge(self, key: AttemptKey) -> None:
        """The scheduler says a cancellation of this attempt may be pending."""
        ...


class Intake:
    """Binds the host's consumer, fetches until stopped, and routes what arrives to the `Sink`."""

    def __init__(
        self,
        subjects: Subjects,
        host_id: str,
        sink: Sink,
        *,
        batch: int,
        reregister: Callable[[], Awaitable[None]],
        bound: asyncio.Event,
        on_drain: Callable[[str | None], None] | None = None,
        remembered: Iterable[AttemptKey] = (),
    ) -> None:
        self._stream = subjects.assignments_stream
        self._durable = subjects.consumer(host_id)
        self._sink = sink
        self._batch = max(batch, 1)
        self._reregister = reregister
        self._on_drain = on_drain
        self._known: OrderedDict[AttemptKey, None] = OrderedDict()
        for key in remembered:  # taken before this start, oldest first
            self._remember(key)
        #: Set once bound to the consumer (the agent's `bound`).
        self.bound = bound
        #: The consumer's, once bound: how often an assignment waiting for its device is kept in progress.
        self.ack_wait_s = 30.0

    async def _bind(self, js: JetStreamContext, stop: asyncio.Event) -> JetStreamContext.PullSubscription | None:
        failures = 0
        while not stop.is_set():
            try:
                info = await js.consumer_info(self._stream, self._durable)
                if info.config.ack_wait:
                    self.ack_wait_s = float(info.config.ack_wait)
                psub = await js.pull_subscribe_bind(durable=self._durable, stream=self._stream)
                self.bound.set()
                logger.info(
                    "bound to the assignments consumer", extra={"stream": self._stream, "consumer": self._durable}
                )
                return psub
            except Exception as exc:
                failures += 1
                logger.warning("cannot bind the assignments consumer yet", extra={"error": repr(exc)})
                if isinstance(exc, nats.js.errors.NotFoundError) and failures % 5 == 0:
                    await self._reregister()  # the scheduler creates the consumer when a host registers
            await sleep_or_stop(stop, backoff_delay(failures, base_s=0.2, cap_s=5.0))
        return None

    async def consume(self, js: JetStreamContext, stop: asyncio.Event) -> None:
        """Fetch and route assignments until `stop` is set (rebinding after repeated failures)."""
        psub: JetStreamContext.PullSubscription | None = None
        failures = 0
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if psub is None:
                    psub = await self._bind(js, stop)
                    if psub is None:
                        break
                fetching = asyncio.ensure_future(psub.fetch(batch=self._batch, timeout=FETCH_WAIT_S))
                await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not fetching.done():
                    fetching.cancel()
                    await asyncio.gather(fetching, return_exceptions=True)
                    break
                try:
                    msgs = fetching.result()
                except nats.errors.TimeoutError:
                    continue  # nothing to do: normal
                except Exception as exc:
                    failures += 1
                    logger.warning("fetching assignments failed", extra={"error": repr(exc), "failures": failures})
                    if isinstance(exc, nats.js.errors.NotFoundError) or failures >= 3:
                        with contextlib.suppress(Exception):
                            await psub.unsubscribe()
                        psub, failures = None, 0
                    await sleep_or_stop(stop, backoff_delay(max(failures, 1), base_s=0.2, cap_s=5.0))
                    continue
                failures = 0
                for msg in msgs:
                    await self._route(msg)
        finally:
            stopping.cancel()
            if psub is not None:  # before draining: a pull subscription can hold a drain for its whole timeout
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()

    async def sweep(self, js: JetStreamContext, wait_s: float) -> int:
        """One last fetch once the agent takes no more work, routing what arrived meanwhile; how many.

        An assignment made just before the host's devices were withdrawn may be published after the last
        fetch: the sink (the workers, refusing by now) gives it back at once instead of leaving it in the
        consumer, where its lease would run out before the next start and spend one of the task's attempts.
        """
        try:
            psub = await js.pull_subscribe_bind(durable=self._durable, stream=self._stream)
        except Exception as exc:
            logger.info("no last look at the assignments consumer", extra={"error": repr(exc)})
            return 0
        try:
            msgs = await psub.fetch(batch=self._batch, timeout=wait_s)
        except Exception:  # nats.errors.TimeoutError when nothing came: the usual case
            msgs = []
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()
        for msg in msgs:
            await self._route(msg)
        return len(msgs)

    def take(self, key: AttemptKey) -> bool:
        """Remember an attempt handed over in a report's reply; False if it was taken already (a duplicate reply's)."""
        return self._remember(key)

    def _remember(self, key: AttemptKey) -> bool:
        """Remember `key`; False if it was known already (a duplicate delivery)."""
        if key in self._known:
            return False
        self._known[key] = None
        while len(self._known) > REMEMBERED_ATTEMPTS:
            self._known.popitem(last=False)
        return True

    async def _route(self, msg: Msg) -> None:
        try:
            assignment = decode(wire.Assignment, msg.data)
        except InvalidRequest as exc:
            logger.error("malformed assignment dropped", extra={"error": exc.message})
            await settle(msg.term())
            return
        fields = {"task_id": str(assignment.task_id), "attempt": assignment.attempt, "device_id": assignment.device_id}
        if not self._sink.has_device(assignment.device_id):
            logger.error("assignment for a device this host does not have", extra=fields)
            await settle(msg.ack())
            return
        if not self._remember((str(assignment.task_id), assignment.attempt)):
            logger.info("duplicate assignment delivery dropped", extra=fields)
            await settle(msg.ack())
            return
        keepalive = asyncio.create_task(self._keep_in_progress(msg))
        self._sink.offer(Received(msg, assignment, keepalive, time.monotonic()))

    async def _keep_in_progress(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(max(self.ack_wait_s / 3, 0.5))
            await settle(msg.in_progress())

    async def on_nudge(self, msg: Msg) -> None:
        """The callback of the host's nudge subscription: a nudge, or a drain notice."""
        try:
            nudge = decode(wire.Nudge, msg.data)
        except InvalidRequest:
            try:
                notice = decode(wire.DrainNotice, msg.data)
            except InvalidRequest:
                return
            if self._on_drain is not None:
                self._on_drain(notice.reason)
            return
        self._sink.nudge((str(nudge.task_id), nudge.attempt))
