"""The lease keeper: renews one attempt's lease and turns what it hears into stops.

It renews at every step boundary (the runner calls `renew` with `progress`), when a nudge arrives, and
on its own at about a third of the ttl (the `LeaseClock`). A renewal carries the latest progress only
until one carrying it is granted (a boundary, or the retry of one whose reply was lost): the scheduler
records a step in the statement that takes the task's lock, and a renewal without progress needs none.

A reply with `cancel_requested` is a cancellation stop, one with `stop` (a time limit) a timeout stop; a
rejected renewal (409, or 404: the scheduler no longer knows the task or host) or no successful renewal
before the local deadline is a lease-loss stop, after which it renews no more. Other errors (timeouts, no
responders, 503, 500) are retried with backoff until the deadline.

With a host's renewal batcher (`group`), it also renews early when a batch goes out and its periodic
renewal falls due within half an interval (`join`): the host's keepers converge on one request per interval.

It keeps renewing while the run winds down after a cancellation or a shutdown: teardown steps need the
lease, and a step that finishes before it stops should not lose its device to another attempt meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from devsched.agent.lease import LeaseClock
from devsched.agent.metrics import RENEWAL_SECONDS
from devsched.agent.stop import StopReason, StopSignal
from devsched.core.backoff import backoff_delay, retry_after
from devsched.core.errors import Conflict, DevschedError, NotFound
from devsched.core.leases import Extension
from devsched.protocol.plans import Progress

if TYPE_CHECKING:
    from devsched.agent.renewals import RenewalBatcher

logger = logging.getLogger(__name__)

#: A keeper joins a batch going out when its periodic renewal falls due within this fraction of its interval.
JOIN_SLACK = 0.5


#: Send one renewal (with progress not yet acknowledged, if any) and return what it granted (the keeper reads
#: `ttl_s` and `cancel_requested`). Raises `Conflict` or `NotFound` when the lease is gone; any other
#: exception counts as transient.
RenewCall = Callable[[Progress | None], Awaitable[Extension]]


def ends_lease(exc: BaseException) -> bool:
    """Whether a renewal error means the lease is gone for good (409 of any kind, or 404)."""
    return isinstance(exc, Conflict | NotFound)


class LeaseKeeper:
    """Keeps one attempt's lease; see the module docstring."""

    def __init__(
        self,
        renew_call: RenewCall,
        stop: StopSignal,
        *,
        clock: LeaseClock | None = None,
        request_timeout_s: float = 5.0,
        context: dict[str, object] | None = None,
        group: RenewalBatcher | None = None,
    ) -> None:
        self._renew_call = renew_call
        self._group = group
        self._stop = stop
        self.clock = clock if clock is not None else LeaseClock()
        self._request_timeout_s = request_timeout_s
        self._log = dict(context or {})
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._nudged = False
        self._joining = False
        self._closed = False
        self._lost = False
        self._failures = 0
        self._retry_at: float | None = None
        #: The latest progress the runner gave, and the latest a granted renewal carried.
        self._progress: Progress | None = None
        self._acknowledged: Progress | None = None
        #: Successful renewals (claims not counted).
        self.renewals = 0

    @property
    def lost(self) -> bool:
        """Whether the keeper has given up on the lease."""
        return self._lost

    def live(self) -> bool:
        """Whether the lease still counts as held; for the runner's check before each step."""
        return not self._lost and self.clock.live()

    def granted(self, sent_at: float, grant: Extension) -> None:
        """Apply a successful claim or renewal whose request was sent at monotonic `sent_at`."""
        self.clock.grant(sent_at, grant.ttl_s)
        self._failures, self._retry_at = 0, None
        if grant.cancel_requested and self._stop.reason is not StopReason.CANCELLED:
            logger.info("cancellation requested", extra=self._log)
            self._stop.request(StopReason.CANCELLED, "cancellation requested")
        if grant.stop is not None and self._stop.reason is not StopReason.TIMEOUT:
            logger.info("time limit reached", extra={**self._log, "stop": grant.stop})
            self._stop.request(StopReason.TIMEOUT, grant.stop)

    def _lose(self, detail: str) -> None:
        if not self._lost:
            self._lost = True
            logger.warning("lease lost", extra={**self._log, "detail": detail})
        self._stop.request(StopReason.LEASE_LOST, detail)
        self._wake.set()

    async def renew(self, progress: Progress | None = None) -> None:
        """Renew now (waiting for one in flight), carrying `progress` if given, else the latest not yet granted."""
        if progress is not None:
            self._progress = progress
        async with self._lock:
            if self._lost or self._closed:
                return
            sent_at = self.clock.now()
            unacknowledged = self._progress if self._progress != self._acknowledged else None
            if not self.clock.live(sent_at):
                self._lose("no successful renewal within the lease ttl")
                return
            try:
                started = time.perf_counter()
                async with asyncio.timeout(min(self._request_timeout_s, self.clock.remaining(sent_at))):
                    grant = await self._renew_call(unacknowledged)
                RENEWAL_SECONDS.observe(time.perf_counter() - started)
            except Exception as exc:
                if ends_lease(exc):
                    code = exc.code if isinstance(exc, DevschedError) else type(exc).__name__
                    self._lose(f"renewal rejected: {code}")
                    return
                self._failures += 1
                ttl = self.clock.ttl_s or 1.0
                self._retry_at = self.clock.now() + max(
                    backoff_delay(self._failures, base_s=min(0.1, ttl / 30), cap_s=max(ttl / 6, 0.1)),
                    retry_after(exc),
                )
                logger.warning(
                    "renewal failed, will retry",
                    extra={**self._log, "error": repr(exc), "failures": self._failures},
                )
                return
            self.renewals += 1
            if unacknowledged is not None:
                self._acknowledged = unacknowledged
            self.granted(sent_at, grant)
        self._wake.set()

    def nudge(self) -> None:
        """Renew at once (a nudge from the scheduler: a cancellation may be pending)."""
        self._nudged = True
        self._wake.set()

    def join(self) -> bool:
        """Renew at once if the periodic renewal is due within `JOIN_SLACK` of an interval (a batch goes out).

        Not while a renewal is in flight or retried after a failure, nor before the first grant. Whether it will.
        """
        if self._finished() or self._lock.locked() or self._retry_at is not None or self._nudged or self._joining:
            return False
        interval = self.clock.interval_s
        if interval is None or self.clock.until_renewal() > interval * JOIN_SLACK:
            return False
        self._joining = True
        self._wake.set()
        return True

    def close(self) -> None:
        """Stop renewing (the run has ended)."""
        self._closed = True
        self._wake.set()

    def _next_wake(self, now: float) -> float:
        """Seconds until the loop should act: renewal due, retry due, or deadline."""
        remaining = self.clock.remaining(now)
        if self._retry_at is not None:
            return min(max(self._retry_at - now, 0.0), remaining)
        return min(self.clock.until_renewal(now), remaining)

    async def run(self) -> None:
        """Renew on schedule and on nudges until closed or the lease is lost."""
        if self._group is not None:
            self._group.enter(self)
        try:
            await self._keep()
        finally:
            if self._group is not None:
                self._group.leave(self)

    async def _keep(self) -> None:
        while not self._finished():
            now = self.clock.now()
            if not self.clock.live(now):
                self._lose("no successful renewal within the lease ttl")
                break
            delay = self._next_wake(now)
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
            self._wake.clear()
            if self._finished():
                break
            if self._nudged or self._joining or self._next_wake(self.clock.now()) <= 0:
                self._nudged = self._joining = False
                await self.renew()

    def _finished(self) -> bool:
        return self._closed or self._lost
