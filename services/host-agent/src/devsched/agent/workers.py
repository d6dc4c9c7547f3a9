"""The device workers: one queue and one worker per device, each running one attempt at a time.

So a device runs at most one attempt at a time and devices run in parallel. An assignment for a busy
device WAITS in that device's queue (kept in progress by the intake) rather than being nak'd: the
scheduler only assigns a device it has released, so the wait is short (the previous attempt is ending,
or its lease expired while a step was finishing), and the waiting assignment is claimed the moment the
device is free instead of at a guessed redelivery delay.

An attempt is recorded as held (`held.py`), claimed (its assignment acked once claimed or found stale),
run, and ended: its report (or its release, when the agent's shutdown stopped it) is spooled and handed to
`ReportDelivery`, and its record removed. Once the agent takes no more work (shutdown or drain), an
assignment that has not started (queued for its device, or still being claimed) is given back: its
release is spooled and sent, and its message acked, so the task goes to another device at once without
spending an attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from opentelemetry.trace import SpanKind

from devsched.agent.attempt import Attempt, AttemptKey, ClaimOutcome, release_of
from devsched.agent.config import DeviceConfig
from devsched.agent.delivery import ReportDelivery
from devsched.agent.held import HeldAttempt, HeldAttempts
from devsched.agent.intake import Received
from devsched.core.leases import Extension
from devsched.protocol import messages as wire
from devsched.protocol.tracing import extract, messaging_attributes, span_name, tracer, use_context
from devsched.service import bind

logger = logging.getLogger(__name__)

#: Builds the attempt of a received assignment on its device.
AttemptFactory = Callable[[Received, DeviceConfig], Attempt]


class DeviceWorkers:
    """The workers of a host's devices and the attempts they run."""

    def __init__(
        self,
        devices: Sequence[DeviceConfig],
        *,
        new_attempt: AttemptFactory,
        reports: ReportDelivery,
        held: HeldAttempts,
    ) -> None:
        self._devices = tuple(devices)
        self._new_attempt = new_attempt
        self._reports = reports
        self._held = held
        self._queues: dict[str, asyncio.Queue[Received]] = {d.device_id: asyncio.Queue() for d in devices}
        self._running: dict[AttemptKey, Attempt] = {}
        self._attempt_tasks: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        #: Set once no new attempt may start (the agent is stopping or draining).
        self._refusing = asyncio.Event()
        #: Why, for the releases of the attempts it gives back.
        self._refusing_why = "agent shutting down"

    # -- what the intake hands in ------------------------------------------------------------------------

    def has_device(self, device_id: str) -> bool:
        """Whether this host has the device."""
        return device_id in self._queues

    def offer(self, received: Received) -> None:
        """Queue an assignment for its device's worker."""
        self._queues[received.assignment.device_id].put_nowait(received)

    def nudge(self, key: AttemptKey) -> None:
        """Renew the running attempt `key` at once, if it runs here."""
        attempt = self._running.get(key)
        if attempt is not None:
            logger.info("nudged: renewing now", extra=attempt.log_fields())
            attempt.nudge()

    # -- the workers ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start one worker per device."""
        self._workers = [asyncio.create_task(self._work(device)) for device in self._devices]

    @property
    def tasks(self) -> frozenset[asyncio.Task[None]]:
        """The attempts being handled (claimed, running or spooling their report)."""
        return frozenset(self._attempt_tasks)

    @property
    def running(self) -> int:
        """How many attempts this host holds now (being claimed or run)."""
        return len(self._running)

    async def _work(self, device: DeviceConfig) -> None:
        queue = self._queues[device.device_id]
        while True:
            received = await queue.get()
            task = asyncio.create_task(self._handle(device, received))
            self._attempt_tasks.add(task)
            try:
                await asyncio.shield(task)
            except Exception:
                logger.exception("attempt handling failed", extra={"device_id": device.device_id})
            finally:
                self._attempt_tasks.discard(task)
                received.stop_keepalive()

    async def _handle(self, device: DeviceConfig, received: Received) -> None:
        attempt = self._new_attempt(received, device)
        a = received.assignment
        msg = received.msg
        subject = msg.subject if msg is not None else "report reply"
        span = tracer().start_as_current_span(
            span_name("process", subject),
            kind=SpanKind.CONSUMER,
            attributes={
                **messaging_attributes(subject, "process", len(msg.data) if msg is not None else 0),
                "devsched.task_id": str(a.task_id),
                "devsched.attempt": a.attempt,
                "devsched.device_id": a.device_id,
            },
        )
        # continue the trace the assignment carries: claim, renewals and the report join the task's trace
        with use_context(extract(msg.headers if msg is not None else None)), span, bind(**attempt.log_fields()):
            if self._refusing.is_set():
                await self._give_back(received)
                return
            self._running[attempt.key] = attempt
            held = HeldAttempt.of(received.assignment)
            try:
                # Before the claim: an agent killed from here on leaves it recorded (one handed over was
                # recorded before its report left the spool). Its directory is made in the same thread (one
                # hop off the event loop for both), and removed if it does not run.
                await asyncio.to_thread(self._begin, held, attempt, received.handed is None)
                # Not forgotten when cancelled or failed: the attempt did not end, and the next start should know.
                if await self._claim(attempt, received):
                    spooled = await attempt.run_and_spool(
                        then=lambda: self._held.forget_now(held), take_next=self._may_take_next
                    )
                    self._reports.send(spooled, attempt.log_fields())
                else:
                    await attempt.discard(then=lambda: self._held.forget_now(held))
            finally:
                del self._running[attempt.key]

    def _may_take_next(self) -> bool:
        """Whether a report may ask for its device's next attempt: the agent still takes work."""
        return not self._refusing.is_set()

    async def take_handed(self, handed: wire.HandedAttempt, sent_at: float, take: Callable[[AttemptKey], bool]) -> None:
        """An attempt a report's reply handed over, already dispatched: recorded as held, then queued to run.

        Called before the report leaves the spool, so an agent killed before the record is written still
        has the report, whose resend (a duplicate) hands the same attempt again. `take` remembers the
        attempt with the intake's (False: taken already, from an earlier reply: dropped).
        """
        a = wire.Assignment(
            task_id=handed.task_id, attempt=handed.attempt, lease_id=handed.lease_id, device_id=handed.device_id,
            plan=handed.plan, ttl_s=handed.ttl_s, expires_at=handed.expires_at,
        )  # fmt: skip
        fields = {"task_id": str(a.task_id), "attempt": a.attempt, "device_id": a.device_id}
        if not self.has_device(a.device_id):
            logger.error("attempt handed over for a device this host does not have", extra=fields)
            return
        if not take((str(a.task_id), a.attempt)):
            logger.info("duplicate hand-over dropped", extra=fields)
            return
        grant = Extension(handed.expires_at, handed.ttl_s, handed.cancel_requested, stop=handed.stop)
        received = Received(None, a, None, sent_at, handed=grant)
        await self._held.hold(HeldAttempt.of(a))
        if self._refusing.is_set():  # asked for while the agent took work; it takes none any more
            await self._give_back(received)
            return
        self.offer(received)

    def _begin(self, held: HeldAttempt, attempt: Attempt, hold: bool) -> None:
        """Record the attempt as held (if `hold`), then make its directory (blocking)."""
        if hold:
            self._held.hold_now(held)
        attempt.prepare()

    async def _claim(self, attempt: Attempt, received: Received) -> bool:
        """Claim the attempt and settle its message; whether it is ours to run (one handed over is)."""
        if received.handed is not None:
            attempt.take(received.handed, received.received_at)
            return True
        outcome = await attempt.claim(self._refusing)
        received.stop_keepalive()
        if outcome is ClaimOutcome.CLAIMED:
            self._reports.kick()
        if outcome is ClaimOutcome.GAVE_UP and self._refusing.is_set():
            # claimed or not (a reply may have been lost), it is given back: another device takes it now
            await self._give_back(received)
            return False
        await received.ack()
        return outcome is ClaimOutcome.CLAIMED

    async def _give_back(self, received: Received) -> None:
        """Release an attempt that never ran here (spooled first, then sent) and ack its message."""
        a = received.assignment
        fields = {"task_id": str(a.task_id), "attempt": a.attempt, "device_id": a.device_id}
        reason = f"{self._refusing_why} before the attempt started"
        spooled = await self._reports.store_release(release_of(a, reason))
        self._reports.send(spooled, fields)
        if received.handed is not None:  # recorded as held when handed over: its release speaks for it now
            await self._held.forget(HeldAttempt.of(a))
        received.stop_keepalive()
        await received.ack()
        logger.info("attempt given back before it started", extra={**fields, "reason": reason})

    # -- stopping ------------------------------------------------------------------------------------------

    async def refuse_new(self, why: str = "agent shutting down") -> None:
        """Start no attempt any more: claims give up, and assignments not started are given back (released)."""
        if not self._refusing.is_set():
            self._refusing_why = why
        self._refusing.set()
        for queue in self._queues.values():
            while not queue.empty():
                await self._give_back(queue.get_nowait())

    def stop_running(self, *, kill: bool = False) -> None:
        """Stop every running attempt at its next step boundary; with `kill`, interrupt every step.

        Teardown steps run after the boundary stop (not after the kill); each attempt is then released.
        """
        for attempt in list(self._running.values()):
            attempt.shut_down(kill=kill)

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the workers and the attempts they handle; the tasks to await."""
        tasks = [*self._workers, *self._attempt_tasks]
        for task in tasks:
            task.cancel()
        return tasks
