"""One assigned attempt on one device: claim it, run its plan while keeping its lease, report how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from devsched.agent.actions import ActionRegistry
from devsched.agent.client import HostClient
from devsched.agent.config import DeviceConfig
from devsched.agent.keeper import LeaseKeeper, ends_lease
from devsched.agent.logstream import LogStreams
from devsched.agent.renewals import RenewalBatcher
from devsched.agent.reporter import Reporter
from devsched.agent.runner import PlanRunner, RunResult, first_progress, skipped
from devsched.agent.spool import SpooledReport
from devsched.agent.steps import GroupLedger, RunIdentity
from devsched.agent.stop import StopReason, StopSignal
from devsched.agent.uploads import UploadsFactory
from devsched.agent.workspace import Workspace, artifacts_dir
from devsched.core.backoff import backoff_delay, retry_after
from devsched.core.errors import InvalidRequest
from devsched.core.leases import Extension
from devsched.core.status import Outcome
from devsched.core.text import fit
from devsched.protocol import messages as wire
from devsched.protocol.base import MAX_REASON_CHARS

logger = logging.getLogger(__name__)


class ClaimOutcome(StrEnum):
    """How a claim ended."""

    #: The attempt is ours: run it.
    CLAIMED = "claimed"
    #: 409 or 404: the assignment is stale (expired, superseded, the task ended); drop it.
    STALE = "stale"
    #: No answer before the assignment's lease must have run out, or the agent is stopping.
    GAVE_UP = "gave_up"


AttemptKey = tuple[str, int]

#: Tries at removing an attempt's directory: a step killed at the same moment may still be writing to it.
_REMOVE_TRIES = 3
_REMOVE_RETRY_S = 0.1


def release_of(assignment: wire.Assignment, reason: str, result: RunResult | None = None) -> wire.ReleaseRequest:
    """The release of an attempt: given back with the steps so far (none when it never ran)."""
    return wire.ReleaseRequest(
        task_id=assignment.task_id,
        attempt=assignment.attempt,
        lease_id=assignment.lease_id,
        reason=fit(reason, MAX_REASON_CHARS),
        result=None if result is None else wire.RunResult(steps=list(result.steps)),
    )


def to_wire(result: RunResult, report_of: wire.Assignment, *, take_next: bool = False) -> wire.ReportRequest:
    """The report of a run (`take_next`: asking for the device's next attempt in the reply)."""
    return wire.ReportRequest(
        task_id=report_of.task_id,
        attempt=report_of.attempt,
        lease_id=report_of.lease_id,
        outcome=result.outcome,
        reason=None if result.reason is None else fit(result.reason, MAX_REASON_CHARS),
        result=wire.RunResult(steps=list(result.steps)),
        take_next=take_next,
    )


class Attempt:
    """Claim, run, renew and report one attempt."""

    def __init__(
        self,
        assignment: wire.Assignment,
        device: DeviceConfig,
        *,
        client: HostClient,
        reporter: Reporter,
        registry: ActionRegistry,
        stop_grace_s: float,
        request_timeout_s: float,
        received_at: float | None = None,
        workspace: Workspace | None = None,
        groups: GroupLedger | None = None,
        logs: LogStreams | None = None,
        uploads: UploadsFactory | None = None,
        renewals: RenewalBatcher | None = None,
    ) -> None:
        self.assignment = assignment
        self.device = device
        a = assignment
        self._log_fields: dict[str, object] = {
            "task_id": str(a.task_id), "attempt": a.attempt, "lease_id": str(a.lease_id), "device_id": a.device_id
        }  # fmt: skip
        self._client = client
        self._reporter = reporter
        self._registry = registry
        self._stop_grace_s = stop_grace_s
        self._request_timeout_s = request_timeout_s
        self._workspace = workspace
        self._groups = groups
        self._logs = logs
        self._uploads = uploads
        self._renewals = renewals
        self.stop = StopSignal()
        self.keeper = LeaseKeeper(
            self._renew_call,
            self.stop,
            request_timeout_s=request_timeout_s,
            context={"task_id": self._log_fields["task_id"], "attempt": assignment.attempt},
            group=renewals,
        )
        #: When the assignment arrived (monotonic), not when a busy device got round to it: the claim
        #: deadline counts from here.
        self.received_at = time.monotonic() if received_at is None else received_at
        #: The first step's progress, when the successful claim carried it (its boundary renews no more).
        self.claimed_with: wire.Progress | None = None
        #: The attempt's directory (`prepare` or `run` makes it), and why it could not be made.
        self._workdir: Path | None = None
        self._workdir_error: str | None = None
        self._prepared = False

    @property
    def key(self) -> AttemptKey:
        """`(task_id, attempt)`: what makes an assignment unique."""
        return str(self.assignment.task_id), self.assignment.attempt

    def log_fields(self) -> dict[str, object]:
        """The ids every log line of this attempt carries (made once: not to be changed)."""
        return self._log_fields

    async def _renew_call(self, progress: wire.Progress | None) -> Extension:
        a = self.assignment
        if self._renewals is not None:
            lease = wire.RenewRequest(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, progress=progress)
            return await self._renewals.renew(lease)
        return await self._client.renew(a.task_id, a.attempt, a.lease_id, progress, timeout_s=self._request_timeout_s)

    async def claim(self, stopping: asyncio.Event) -> ClaimOutcome:
        """Claim the attempt, retrying transient failures until the assignment's lease must have run out.

        The lease was granted for `ttl_s` no later than the message was received, so past that (on the
        monotonic clock) the claim cannot succeed any more and the sweeper will requeue the task.

        When the scheduler said it accepts it, the claim carries the first step's progress, saving that
        step's boundary renewal. A claim refused as invalid with it (a scheduler that does not know the
        field after all, such as an older one answering during a rolling upgrade) is sent again without.
        """
        a = self.assignment
        give_up_at = self.received_at + a.ttl_s
        failures = 0
        while not stopping.is_set():
            sent_at = self.keeper.clock.now()
            timeout = min(self._request_timeout_s, max(give_up_at - sent_at, 0.05))
            progress = first_progress(a.plan.steps, self.stop) if self._client.claim_progress else None
            try:
                grant = await self._client.claim(a.task_id, a.attempt, a.lease_id, progress, timeout_s=timeout)
            except Exception as exc:
                if ends_lease(exc):
                    logger.info("assignment is stale", extra={**self.log_fields(), "error": repr(exc)})
                    return ClaimOutcome.STALE
                if progress is not None and isinstance(exc, InvalidRequest):
                    self._client.claim_progress = False  # until a register or heartbeat reply says so again
                    logger.warning(
                        "claim with progress refused, claiming without", extra={**self.log_fields(), "error": repr(exc)}
                    )
                    continue
                failures += 1
                logger.warning("claim failed, will retry", extra={**self.log_fields(), "error": repr(exc)})
                delay = max(backoff_delay(failures, base_s=0.1, cap_s=max(a.ttl_s / 6, 0.1)), retry_after(exc))
                if time.monotonic() + delay >= give_up_at:
                    return ClaimOutcome.GAVE_UP
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stopping.wait()
                continue
            self.keeper.granted(sent_at, grant)
            self.claimed_with = progress
            logger.info("attempt claimed", extra={**self.log_fields(), "ttl_s": grant.ttl_s})
            return ClaimOutcome.CLAIMED
        return ClaimOutcome.GAVE_UP

    def take(self, grant: Extension, sent_at: float) -> None:
        """Start an attempt a report's reply handed over, already dispatched: as `claim` with `grant`.

        The hand-over recorded the first step's progress, as a claim carrying it would have (its boundary
        renews no more); the lease runs from `sent_at`, when the report was sent.
        """
        self.claimed_with = first_progress(self.assignment.plan.steps, self.stop)
        self.keeper.granted(sent_at, grant)
        logger.info("attempt taken from a report's reply", extra={**self.log_fields(), "ttl_s": grant.ttl_s})

    def prepare(self) -> None:
        """Create the attempt's directory now, blocking (for the thread that records the attempt as held).

        `run` then uses it (or says why it could not be made); an attempt that does not run removes it with
        `discard`.
        """
        if self._workspace is None or self._prepared:
            return
        self._prepared = True
        a = self.assignment
        try:
            self._workdir = self._workspace.create(str(a.task_id), a.attempt)
        except (OSError, ValueError) as exc:
            self._workdir_error = str(exc)

    async def run(self) -> RunResult:
        """Run the plan while the keeper renews the lease, in a directory of the attempt's own.

        The directory exists before the first step and is gone when this returns or is cancelled, whatever
        the outcome (an agent killed outright leaves it to the next start, which clears it).
        """
        result = await self._execute()
        if self._workdir is not None:
            await self._remove(self._workdir)
            self._workdir = None
        self._log_end(result)
        return result

    async def run_and_spool(
        self, then: Callable[[], None] | None = None, take_next: Callable[[], bool] | None = None
    ) -> SpooledReport:
        """`run`, then its report (or release) spooled; delivering it is the caller's (it may take a long outage).

        The report asks for the device's next attempt (`take_next` in its reply) when the scheduler said it
        takes that and `take_next` (asked once the run ended) says the device may take more work.

        The directory's removal, the spool's write and `then` (blocking file work of the caller's, such
        as the held record's move) share one thread: an attempt's end costs one hop off the event loop.
        """
        result = await self._execute()
        asking = self._client.take_next and take_next is not None and take_next()
        key, body = self._reporter.encoded(self._final(result, take_next=asking))
        workdir = self._workdir
        self._workdir = None

        def end() -> tuple[SpooledReport, bool]:
            removed = workdir is None or self._workspace is None or self._workspace.remove(workdir)
            spooled = self._reporter.put_now(key, body)
            if then is not None:
                then()
            return spooled, removed

        spooled, removed = await asyncio.to_thread(end)
        if not removed and workdir is not None:
            await self._remove(workdir, tried=1)
        self._log_end(result)
        return spooled

    async def discard(self, then: Callable[[], None] | None = None) -> None:
        """For an attempt that will not run: remove the directory `prepare` made, and `then`, in one thread."""
        workdir = self._workdir
        self._workdir = None

        def end() -> bool:
            removed = workdir is None or self._workspace is None or self._workspace.remove(workdir)
            if then is not None:
                then()
            return removed

        if not await asyncio.to_thread(end) and workdir is not None:
            await self._remove(workdir, tried=1)

    def _log_end(self, result: RunResult) -> None:
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "attempt ended", extra={**self.log_fields(), "outcome": result.outcome.value, "reason": result.reason}
            )

    async def _execute(self) -> RunResult:
        """Run the plan in the attempt's directory, which is left for the caller unless this raises."""
        a = self.assignment
        if self._workspace is not None and not self._prepared:
            self._prepared = True
            try:
                self._workdir = await asyncio.to_thread(self._workspace.create, str(a.task_id), a.attempt)
            except (OSError, ValueError) as exc:
                self._workdir_error = str(exc)
        if self._workdir_error is not None:
            error = self._workdir_error
            logger.error("cannot create the attempt's directory", extra={**self.log_fields(), "error": error})
            return self._not_run(f"cannot create the attempt's directory: {error}")
        try:
            return await self._run_in(self._workdir)
        except BaseException:
            if self._workdir is not None:
                workdir, self._workdir = self._workdir, None
                await self._remove(workdir)
            raise

    def _not_run(self, reason: str) -> RunResult:
        steps = tuple(skipped(step.name, f"skipped: {reason}") for step in self.assignment.plan.steps)
        return RunResult(Outcome.FAILED, reason, steps)

    async def _run_in(self, workdir: Path | None) -> RunResult:
        a = self.assignment
        identity = RunIdentity(
            task_id=str(a.task_id), attempt=a.attempt, lease_id=str(a.lease_id), device_id=a.device_id
        )
        log = self._logs.open(a.task_id, a.attempt, a.lease_id) if self._logs is not None else None
        user = None if self._workspace is None else self._workspace.user
        uploads = (
            self._uploads(a, artifacts_dir(workdir), user, self.stop)
            if self._uploads is not None and workdir is not None
            else None
        )
        runner = PlanRunner(
            a.plan.steps,
            identity=identity,
            stop=self.stop,
            renew=self.keeper.renew,
            lease_live=self.keeper.live,
            device_env=self.device.env,
            registry=self._registry,
            stop_grace_s=self._stop_grace_s,
            tmpdir=None if workdir is None else str(workdir),
            artifacts_dir=None if workdir is None else str(artifacts_dir(workdir)),
            user=None if self._workspace is None else self._workspace.user,
            groups=self._groups,
            claimed=self.claimed_with,
            log=log,
            artifacts=None if uploads is None else uploads.after_step,
        )
        keeping = asyncio.create_task(self.keeper.run())
        try:
            result = await runner.run()
            if log is not None and self._logs is not None:
                await self._logs.finish(log, result, self.stop)  # the lease is still renewed meanwhile
            return result
        finally:
            if log is not None:
                log.close()
            self.keeper.close()
            await keeping

    async def _remove(self, workdir: Path, *, tried: int = 0) -> None:
        assert self._workspace is not None
        # In a thread, which finishes even if this task is cancelled meanwhile.
        for attempt in range(tried, _REMOVE_TRIES):
            if attempt > 0:
                await asyncio.sleep(_REMOVE_RETRY_S)
            if await asyncio.to_thread(self._workspace.remove, workdir):
                return
        logger.warning("attempt directory left behind", extra={**self.log_fields(), "path": str(workdir)})

    def _final(self, result: RunResult, *, take_next: bool = False) -> wire.ReportRequest | wire.ReleaseRequest:
        """The report of a run, or for a run the shutdown stopped, the release (which takes nothing next)."""
        if result.released:
            return release_of(self.assignment, result.reason or "shutdown", result)
        return to_wire(result, self.assignment, take_next=take_next)

    async def spool(self, result: RunResult) -> SpooledReport:
        """Write the report (or, for a run the shutdown stopped, the release) to the spool.

        Delivering it is the caller's (it may take a long outage).
        """
        final = self._final(result)
        if isinstance(final, wire.ReleaseRequest):
            return await self._reporter.store_release(final)
        return await self._reporter.store(final)

    async def report(self, result: RunResult, *, give_up: asyncio.Event | None = None) -> None:
        """Spool the report, then deliver it (it stays spooled if `give_up` is set first)."""
        await self._reporter.deliver(await self.spool(result), give_up=give_up)

    def nudge(self) -> None:
        """Renew at once: the scheduler says a cancellation may be pending."""
        self.keeper.nudge()

    def shut_down(self, *, kill: bool = False) -> None:
        """Stop at the next step boundary; with `kill`, interrupt every step and start no other.

        Teardown (`always`) steps still run after the boundary stop; the attempt is then released.
        """
        if kill:
            self.stop.kill("agent shutting down; grace period over")
        else:
            self.stop.request(StopReason.SHUTDOWN, "agent shutting down")
