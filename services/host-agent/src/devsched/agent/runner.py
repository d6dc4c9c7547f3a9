"""The plan runner: one attempt's steps in order, with collaborative stop and teardown steps.

Rules (PROTOCOL.md, host-agent.md):

- Before each step starts, the renew hook is called with `progress` (the step boundary renewal), then the
  stop state and the lease's local deadline are checked: no step starts after a stop of its kind, and no
  step at all once the lease is lost ("no step starts after the deadline"). The first step's renewal is
  left out when the claim carried its progress (`claimed`): the claim just extended the lease, and its
  reply's stop state is already in the stop signal.
- A failed or timed-out step ends the planned work: later steps are skipped, except `always` steps.
- `always` steps run after a failure, a cancellation stop or a shutdown stop (the lease is still held),
  never after a lease loss or once the shutdown grace is over (`KILL`).
- Every step of the plan is in the result, in order.

Outcome: `done` when every step is done; `failed` when a step failed or timed out first, or the run was
stopped by a lease loss or a time limit (its reason then starts with the limit: `attempt_timeout`);
`cancelled` when a cancellation stopped it first. A run the agent's shutdown stopped first is `released`:
given back to the scheduler, which queues the task again without spending an attempt (its outcome field says
`failed`, for an agent that could only report). A stop counts only if it changed something (a step was
interrupted or skipped): a plan that ran to the end reports how its steps ended. Failures after the first
cause (a failing teardown after a cancellation or a shutdown, a lease loss during teardown) keep the outcome
and are named in the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from devsched.agent.actions import ActionRegistry, default_registry
from devsched.agent.metrics import STEP_SECONDS, UNKNOWN_ACTION
from devsched.agent.results import summarise
from devsched.agent.steps import (
    FAILURES,
    ActionError,
    ActionResult,
    GroupLedger,
    OutputSink,
    RunIdentity,
    RunLog,
    StepContext,
    StepUser,
)
from devsched.agent.stop import StopLevel, StopReason, StopSignal
from devsched.core.status import Outcome
from devsched.core.text import fit
from devsched.protocol.artifacts import StepArtifacts
from devsched.protocol.plans import MAX_OUTPUT_TAIL_CHARS, Progress, ResultFiles, StepResult, StepStatus

logger = logging.getLogger(__name__)

#: The tracer of the steps' spans (a proxy: it follows the provider `main` installs).
_TRACER = trace.get_tracer("devsched.agent")

#: Extra time past `timeout_s` (and two stop graces) after which the runner gives up on an action that
#: ignores its own timeout.
BACKSTOP_S = 5.0


class StepSpec(Protocol):
    """What the runner needs of a plan step (the protocol's `Step` model has these fields)."""

    @property
    def name(self) -> str: ...  # noqa: D102
    @property
    def action(self) -> str: ...  # noqa: D102
    @property
    def args(self) -> Mapping[str, Any]: ...  # noqa: D102
    @property
    def timeout_s(self) -> float: ...  # noqa: D102
    @property
    def interruptible(self) -> bool: ...  # noqa: D102
    @property
    def always(self) -> bool: ...  # noqa: D102
    @property
    def results(self) -> ResultFiles | None: ...  # noqa: D102


@dataclass(frozen=True, slots=True)
class PlanStep:
    """A plan step with the protocol's defaults (for tests and local use)."""

    name: str
    action: str
    args: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 3600.0
    interruptible: bool = False
    always: bool = False
    results: ResultFiles | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    """What the attempt reports (its steps are the wire's `StepResult`s: the report copies nothing).

    `released`: the agent's shutdown stopped the run before it ended on its own, so the attempt is given
    back (`P.host.<host_id>.release`) rather than reported.
    """

    outcome: Outcome
    reason: str | None
    steps: tuple[StepResult, ...]
    released: bool = False


#: Called at each step boundary with the step about to start; renews the lease (and may request a stop).
RenewHook = Callable[[Progress], Awaitable[None]]
#: Called after each step that ran, with its name: stores the artifacts it left (issue 12; never raises).
ArtifactsHook = Callable[[str], Awaitable[StepArtifacts | None]]


def utc_now() -> datetime:
    """The current UTC time."""
    return datetime.now(UTC)


async def _no_renewal(progress: Progress) -> None:
    return None


def skipped(name: str, why: str) -> StepResult:
    """The result of a step that never started, with why in place of its output."""
    return StepResult(name=name, status=StepStatus.SKIPPED, output_tail=why)


def skip_reason(step: StepSpec, stop: StopSignal, *, broken: bool) -> str | None:
    """Why `step` may not start now (after a stop, or after an earlier failure when `broken`), or None."""
    if stop.halted:
        reason, detail = stop.halt or (StopReason.LEASE_LOST, "")
        return f"skipped: {reason.value}" + (f" ({detail})" if detail else "")
    if step.always:
        return None
    if stop.stopped:
        return f"skipped: {stop.reason.value}"
    if broken:
        return "skipped: an earlier step failed"
    return None


def first_progress(steps: Sequence[StepSpec], stop: StopSignal) -> Progress | None:
    """The progress of the plan's first step if it may start now (what a claim may carry), else None."""
    if not steps or skip_reason(steps[0], stop, broken=False) is not None:
        return None
    return Progress(step=steps[0].name, index=0, of=len(steps))


def _describe(name: str, report: StepResult, timeout_s: float) -> str:
    if report.status is StepStatus.TIMED_OUT:
        return f"step {name!r} timed out after {timeout_s:g} s"
    if report.exit_code is not None:
        return f"step {name!r} failed with exit code {report.exit_code}"
    tail = (report.output_tail or "").strip()
    first_line = tail.splitlines()[0] if tail else ""
    return f"step {name!r} failed" + (f": {first_line}" if first_line else "")


class PlanRunner:
    """Runs one attempt's plan; see the module docstring for the rules."""

    def __init__(
        self,
        steps: Sequence[StepSpec],
        *,
        identity: RunIdentity,
        stop: StopSignal,
        renew: RenewHook = _no_renewal,
        lease_live: Callable[[], bool] = lambda: True,
        device_env: Mapping[str, str] | None = None,
        registry: ActionRegistry | None = None,
        stop_grace_s: float = 5.0,
        now: Callable[[], datetime] = utc_now,
        tmpdir: str | None = None,
        artifacts_dir: str | None = None,
        user: StepUser | None = None,
        groups: GroupLedger | None = None,
        claimed: Progress | None = None,
        log: RunLog | None = None,
        artifacts: ArtifactsHook | None = None,
    ) -> None:
        self._steps = tuple(steps)
        self._artifacts = artifacts
        #: The progress the (successful) claim carried: the boundary of that step does not renew again.
        self._claimed = claimed
        self._identity = identity
        self._stop = stop
        self._renew = renew
        self._lease_live = lease_live
        self._device_env = dict(device_env or {})
        self._registry = registry if registry is not None else default_registry()
        self._stop_grace_s = stop_grace_s
        self._now = now
        self._tmpdir = tmpdir
        self._artifacts_dir = artifacts_dir
        self._user = user
        self._groups = groups
        self._log = log
        #: The first step failure that happened before any stop: the run's cause, if it is one.
        self._failure: str | None = None
        #: Failures after the first cause, for the reason.
        self._later_failures: list[str] = []
        self._broken = False

    def _skip_reason(self, step: StepSpec) -> str | None:
        """Why `step` may not start now, or None if it may."""
        return skip_reason(step, self._stop, broken=self._broken)

    async def _boundary(self, progress: Progress) -> None:
        if progress == self._claimed:
            self._claimed = None  # the claim was this boundary's renewal (only the first step's can match)
        else:
            try:
                await self._renew(progress)
            except Exception:
                # The hook's own errors must not end the run: the local deadline still guards the lease.
                logger.exception("renewal at step boundary failed", extra={"progress": progress.step})
        if not self._lease_live():
            self._stop.request(StopReason.LEASE_LOST, "no successful renewal within the lease ttl")

    async def run(self) -> RunResult:
        """Run the plan to its end (or its stop) and say how it went."""
        reports: list[StepResult] = []
        of = len(self._steps)
        for index, step in enumerate(self._steps):
            skip = self._skip_reason(step)
            if skip is None:
                await self._boundary(Progress(step=step.name, index=index, of=of))
                skip = self._skip_reason(step)
            if skip is not None:
                reports.append(skipped(step.name, skip))
                continue
            report = await self._run_step(step, index)
            reports.append(report)
            if report.status in FAILURES:
                self._broken = True
                described = _describe(step.name, report, step.timeout_s)
                if self._failure is None and not self._stop.stopped:
                    self._failure = described
                else:
                    self._later_failures.append(described)
        outcome, reason = self._verdict(reports)
        stop_mattered = any(r.status in (StepStatus.SKIPPED, StepStatus.INTERRUPTED) for r in reports)
        released = (
            self._failure is None and self._stop.reason is StopReason.SHUTDOWN and self._stop.stopped and stop_mattered
        )
        return RunResult(outcome, reason, tuple(reports), released=released)

    def _verdict(self, reports: Sequence[StepResult]) -> tuple[Outcome, str | None]:
        stop_mattered = any(r.status in (StepStatus.SKIPPED, StepStatus.INTERRUPTED) for r in reports)
        notes = list(self._later_failures)
        if self._failure is not None:
            outcome, cause = Outcome.FAILED, self._failure
            halt = self._stop.halt
            if halt is not None and stop_mattered:
                notes.append(f"{halt[0].value}: {halt[1]}" if halt[1] else halt[0].value)
        elif self._stop.stopped and stop_mattered:
            first = self._stop.reason
            outcome = Outcome.CANCELLED if first is StopReason.CANCELLED else Outcome.FAILED
            cause = f"{first.value}: {self._stop.detail}" if self._stop.detail else first.value
            if first is StopReason.TIMEOUT:
                cause = self._stop.detail  # the limit's code, the task's reason: `attempt_timeout`, `deadline_exceeded`
            halt = self._stop.halt
            if first is not StopReason.LEASE_LOST and halt is not None and halt[0] is not first:
                notes.append(f"then {halt[0].value}" + (f": {halt[1]}" if halt[1] else ""))
        elif notes:
            # Only reachable if a stop that changed nothing came first and a step failed afterwards.
            outcome, cause = Outcome.FAILED, notes.pop(0)
        else:
            return Outcome.DONE, None
        return outcome, "; ".join([cause, *notes])

    def _threshold(self, step: StepSpec) -> StopLevel:
        if not step.interruptible:
            return StopLevel.KILL
        return StopLevel.HALT if step.always else StopLevel.STOP

    async def _run_step(self, step: StepSpec, index: int) -> StepResult:
        """Run `step` in a span `step <action>` (its name, action, index, then status and exit code)."""
        attributes: dict[str, str | int] = {
            "devsched.step.name": step.name,
            "devsched.step.action": step.action,
            "devsched.step.index": index,
        }
        with _TRACER.start_as_current_span(f"step {step.action}", attributes=attributes) as span:
            report = await self._step(step, index)
            span.set_attribute("devsched.step.status", report.status.value)
            if report.exit_code is not None:
                span.set_attribute("process.exit.code", report.exit_code)
            if report.status in FAILURES:
                span.set_status(Status(StatusCode.ERROR, report.status.value))
            return report

    async def _step(self, step: StepSpec, index: int) -> StepResult:
        started_at = self._now()
        # DEBUG: an attempt logs one INFO line at its start ("attempt claimed") and one at its end ("attempt
        # ended", with the outcome and the first failing step in its reason); each step is in the report.
        debug = logger.isEnabledFor(logging.DEBUG)
        log = {"step": step.name, "action": step.action, "task_id": self._identity.task_id} if debug else {}
        if debug:
            logger.debug("step started", extra=log)
        output = self._log.step(step.name, index) if self._log is not None else None
        started = time.perf_counter()
        with self._stop.interrupt(self._threshold(step)) as interrupt:
            result = await self._call(step, interrupt, output)
        # A plug-in's tail may hold anything; the report carries only text the scheduler can store.
        result = replace(result, output_tail=fit(result.output_tail, MAX_OUTPUT_TAIL_CHARS, tail=True))
        finished_at = self._now()
        action = step.action if step.action in self._registry else UNKNOWN_ACTION
        STEP_SECONDS.labels(action, result.status.value).observe(time.perf_counter() - started)
        if debug:
            logger.debug("step ended", extra={**log, "status": result.status.value, "exit_code": result.exit_code})
        if self._log is not None:
            self._log.step_end(step.name, index, result.status, result.exit_code)
        # Whatever the status: a failed or timed-out test run is when its results matter most.
        results = await summarise(step.results, self._artifacts_dir, self._user)
        artifacts = await self._artifacts(step.name) if self._artifacts is not None else None
        return StepResult(
            name=step.name,
            status=result.status,
            exit_code=result.exit_code,
            started_at=started_at,
            finished_at=finished_at,
            output_tail=result.output_tail,
            results=results,
            artifacts=artifacts,
        )

    async def _call(self, step: StepSpec, interrupt: asyncio.Event, output: OutputSink | None) -> ActionResult:
        ctx = StepContext(
            args=step.args,
            device_env=self._device_env,
            identity=self._identity,
            interrupt=interrupt,
            timeout_s=step.timeout_s,
            stop_grace_s=self._stop_grace_s,
            tmpdir=self._tmpdir,
            artifacts_dir=self._artifacts_dir,
            user=self._user,
            groups=self._groups,
            output=output,
        )
        backstop = asyncio.timeout(step.timeout_s + 2 * self._stop_grace_s + BACKSTOP_S)
        try:
            action = self._registry.get(step.action)
            async with backstop:
                return await action(ctx)
        except ActionError as exc:
            return ActionResult(StepStatus.FAILED, None, str(exc))
        except TimeoutError as exc:
            if backstop.expired():
                return ActionResult(StepStatus.TIMED_OUT, None, f"action {step.action!r} ignored its timeout")
            return ActionResult(StepStatus.FAILED, None, f"action {step.action!r} raised {exc!r}")
        except Exception as exc:
            logger.exception("action raised", extra={"step": step.name, "action": step.action})
            return ActionResult(StepStatus.FAILED, None, f"action {step.action!r} raised {exc!r}")
