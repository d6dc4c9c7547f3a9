"""The agent's shutdown (SIGTERM), in phases that each wait a bounded time for the attempts to end.

1. No new work (the intake has stopped fetching): queued assignments are nak'd, claims give up.
2. Running attempts get `shutdown_grace_s` to finish on their own.
3. They stop as for a lease loss (interruptible steps are interrupted, no new step starts).
4. After two stop graces and a request timeout, every step is interrupted, interruptible or not.
5. Report delivery is given up: what is not answered stays in the spool for the next start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

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


async def shut_down(workers: DeviceWorkers, reports: ReportDelivery, graces: Graces) -> None:
    """Run the phases of the module docstring, returning as soon as nothing is left running."""

    def running() -> frozenset[asyncio.Task[None]]:
        return workers.tasks | reports.tasks

    await workers.refuse_new()
    if running():
        logger.info("shutting down: waiting for running attempts", extra={"grace_s": graces.shutdown_s})
    if await wait_ended(running(), graces.shutdown_s):
        return
    workers.stop_running()
    if await wait_ended(running(), 2 * graces.stop_s + graces.request_timeout_s):
        return
    workers.stop_running(kill=True)
    if await wait_ended(running(), graces.stop_s + graces.request_timeout_s):
        return
    reports.give_up()
    await wait_ended(running(), graces.request_timeout_s + 1)
