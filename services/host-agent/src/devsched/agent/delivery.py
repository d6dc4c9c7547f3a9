"""Reports (and releases) on their way to the scheduler, each in a task of its own, apart from the device workers.

A scheduler outage must not keep a device from its next attempt (the scheduler reserves it again only
once the previous attempt has ended), so an attempt's report is delivered in the background. Reports left
in the spool by an earlier run are resent at start, before any new work is taken. At shutdown delivery
is given up: what is not answered by then stays in the spool for the next start (`Reporter`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from devsched.agent.reporter import Reporter
from devsched.agent.spool import SpooledReport
from devsched.protocol import messages as wire
from devsched.service import bind

logger = logging.getLogger(__name__)


class ReportDelivery:
    """The agent's reports in flight."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter
        self._tasks: set[asyncio.Task[None]] = set()
        self._give_up = asyncio.Event()
        #: Takes the attempt a report's reply handed over (`take_next`), and when that report was sent
        #: (the device workers'); awaited before the report leaves the spool.
        self.on_next: Callable[[wire.HandedAttempt, float], Awaitable[None]] | None = None

    async def _answered(self, reply: wire.ReportReply | wire.ReleaseReply, sent_at: float) -> None:
        handed = getattr(reply, "next", None)
        if handed is not None and self.on_next is not None:
            await self.on_next(handed, sent_at)

    @property
    def tasks(self) -> frozenset[asyncio.Task[None]]:
        """The deliveries under way."""
        return frozenset(self._tasks)

    def kick(self) -> None:
        """Retry every waiting report now: the scheduler just answered another request."""
        self._reporter.kick()

    async def resend_spooled(self, stop: asyncio.Event) -> None:
        """Deliver what an earlier run left in the spool; gives up (leaving them there) once `stop` is set."""
        pending = await self._reporter.pending()
        if pending:
            logger.info("resending spooled reports", extra={"count": len(pending)})
        await asyncio.gather(
            *(self._reporter.deliver(report, give_up=stop, answered=self._answered) for report in pending)
        )

    async def store_release(self, release: wire.ReleaseRequest) -> SpooledReport:
        """Spool a release (durably, before it is sent with `send`)."""
        return await self._reporter.store_release(release)

    def send(self, spooled: SpooledReport, fields: dict[str, object]) -> None:
        """Deliver a spooled report in the background, logging with `fields` (the attempt's ids)."""
        task = asyncio.create_task(self._deliver(spooled, fields))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, spooled: SpooledReport, fields: dict[str, object]) -> None:
        with bind(**fields):
            await self._reporter.deliver(spooled, give_up=self._give_up, answered=self._answered)

    def give_up(self) -> None:
        """Stop retrying: what is not delivered now stays in the spool for the next start."""
        self._give_up.set()

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the deliveries under way; the tasks to await."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks
