"""The agent's way out, after SIGTERM (shutdown) or a drain (SIGUSR1, `devsched drain --host`), in phases.

1. No new work: the intake has stopped fetching; the host's devices are withdrawn (registered again with
   none, so nothing new is assigned here), and the assignments that have not started are given back.
2. Running attempts finish on their own: while draining, for as long as they take (the agent then exits
   0); after SIGTERM, for what is left of `shutdown_grace_s`, counted from when the agent stopped taking
   work (a drain that came first has used it up).
3. They stop at their next step boundary: interruptible steps are stopped (TERM, stop grace, KILL), no
   planned step starts, the teardown (`always`) steps run, and each attempt is released (given back:
   the task is queued again at once without spending an attempt, the device free at once).
4. After two stop graces and a request timeout, every step is interrupted, interruptible or not, and no
   other starts; the attempts are released.
5. Delivery is given up: what is not answered by then (reports, releases) stays in the spool, and the next
   start sends it before it takes any work.

Every phase waits until nothing runs any more (an attempt, or the delivery of its report or release).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from devsched.agent.config import AgentConfig
from devsched.agent.delivery import ReportDelivery
from devsched.agent.workers import DeviceWorkers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Graces:
    """How long each phase may take."""

    #: Phase 2: attempts finish on their own.
    shutdown_s: float
    #: Between SIGTERM and SIGKILL of a step's process group.
    stop_s: float
    #: One request to the scheduler (a report, a renewal).
    request_timeout_s: float

    @classmethod
    def of(cls, config: AgentConfig) -> Graces:
        """The graces an agent's configuration sets."""
        return cls(config.shutdown_grace_s, config.stop_grace_s, config.request_timeout_s)


async def wait_ended(tasks: Iterable[asyncio.Task[None]], seconds: float) -> bool:
    """Wait up to `seconds` for `tasks`; True when none is left running."""
    pending = set(tasks)
    if pending:
        await asyncio.wait(pending, timeout=seconds)
    return not any(not task.done() for task in pending)


Running = Callable[[], frozenset[asyncio.Task[None]]]


async def wait_idle(running: Running, seconds: float | None, *, until: asyncio.Event | None = None) -> bool:
    """Wait up to `seconds` (None: no limit) until `running()` is empty (True), asking it again as tasks end.

    An attempt that ends starts the delivery of its report, so the tasks to wait for change meanwhile.
    With `until`, also stop waiting (False) once it is set.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        pending = running()
        if not pending:
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or (until is not None and until.is_set()):
            return False
        waits: set[asyncio.Future[Any]] = set(pending)
        stopping = asyncio.ensure_future(until.wait()) if until is not None else None
        if stopping is not None:
            waits.add(stopping)
        try:
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopping is not None:
                stopping.cancel()


async def shut_down(
    workers: DeviceWorkers,
    reports: ReportDelivery,
    graces: Graces,
    *,
    withdraw: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    since: float,
    why: str = "agent shutting down",
) -> None:
    """Run the phases of the module docstring, returning as soon as nothing is left running.

    `stop` is set by SIGTERM; until then (a drain) phase 2 has no end. `since` is when the agent stopped
    taking work (monotonic); `why` is given with the releases of attempts that had not started.
    """

    def running() -> frozenset[asyncio.Task[None]]:
        return workers.tasks | reports.tasks

    await withdraw()
    await workers.refuse_new(why)
    if running():
        logger.info(
            "taking no more work: waiting for running attempts",
            extra={"grace_s": graces.shutdown_s, "draining": not stop.is_set(), "attempts": workers.running},
        )
    if await wait_idle(running, None, until=stop):
        return
    left = since + graces.shutdown_s - time.monotonic()
    if await wait_idle(running, max(left, 0.0)):
        return
    logger.info(
        "shutdown grace over: stopping attempts at their next step boundary", extra={"attempts": workers.running}
    )
    workers.stop_running()
    if await wait_idle(running, 2 * graces.stop_s + graces.request_timeout_s):
        return
    logger.warning("attempts still running: interrupting every step", extra={"attempts": workers.running})
    workers.stop_running(kill=True)
    if await wait_idle(running, graces.stop_s + graces.request_timeout_s):
        return
    reports.give_up()
    await wait_idle(running, graces.request_timeout_s + 1)
