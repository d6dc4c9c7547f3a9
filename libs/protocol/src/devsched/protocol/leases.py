"""Lease endpoints of a host: `P.host.<host_id>.claim|renew|renewals|report|reports|release`."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from devsched.core.limits import MAX_RENEWALS_PER_REQUEST, MAX_REPORTS_PER_REQUEST
from devsched.core.status import Outcome, TaskStatus
from devsched.protocol.base import Id, Lax, Reason, ReplyModel, RequestModel, Timestamp
from devsched.protocol.events import Assignment, ErrorDetail
from devsched.protocol.plans import Progress, RunResult

__all__ = [
    "ClaimRequest",
    "HandedAttempt",
    "LeaseReply",
    "LeaseRequest",
    "ReleaseReply",
    "ReleaseRequest",
    "RenewRequest",
    "RenewalOutcome",
    "RenewalsReply",
    "RenewalsRequest",
    "ReportOutcome",
    "ReportReply",
    "ReportRequest",
    "ReportsReply",
    "ReportsRequest",
]


class LeaseRequest(RequestModel):
    """The lease a host names; the host id comes from the subject."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt number from the assignment."""
    lease_id: Id
    """The lease id from the assignment."""


class ClaimRequest(LeaseRequest):
    """`P.host.<host_id>.claim`: the host starts the attempt (`assigned` -> `dispatched`)."""

    progress: Progress | None = Field(default=None, exclude_if=lambda progress: progress is None)
    """The first step's progress (an addition), as its boundary renewal would carry it, which the claim
    then replaces; sent only to a scheduler whose register or heartbeat reply said `claim_progress`.
    Left out when None, so a claim without it is the one an older scheduler takes."""


class RenewRequest(LeaseRequest):
    """`P.host.<host_id>.renew`: extend the lease from the database's now by its ttl."""

    progress: Progress | None = None
    """Where the run is; sent at every step boundary."""


class RenewalsRequest(RequestModel):
    """`P.host.<host_id>.renewals` (an addition): renew several of the host's leases in one request.

    Each entry is what a `renew` request would carry. Sent only to a scheduler whose register or heartbeat
    reply said `renewals`; an older scheduler does not serve the subject.
    """

    leases: list[RenewRequest] = Field(min_length=1, max_length=MAX_RENEWALS_PER_REQUEST)
    """The leases to renew, each named once."""

    @field_validator("leases")
    @classmethod
    def _each_once(cls, leases: list[RenewRequest]) -> list[RenewRequest]:
        _each_attempt_once(leases, "duplicate_lease")
        return leases


def _each_attempt_once(entries: Sequence[LeaseRequest], error_type: str) -> None:
    """Refuse a list that names an attempt twice (its answers could not be told apart)."""
    seen: set[tuple[Id, int]] = set()
    for entry in entries:
        key = (entry.task_id, entry.attempt)
        if key in seen:
            raise PydanticCustomError(
                error_type, "each attempt is named once; repeated: {task_id} attempt {attempt}",
                {"task_id": entry.task_id, "attempt": entry.attempt},
            )  # fmt: skip
        seen.add(key)


class RenewalOutcome(ReplyModel):
    """One lease's answer in a `renewals` reply: what `renew` would have answered it, grant or error."""

    task_id: Id
    """The task, as named in the request."""
    attempt: int = Field(ge=1)
    """The attempt, as named in the request."""
    lease_id: Id
    """The lease, as named in the request."""
    expires_at: Timestamp | None = Field(default=None, exclude_if=lambda v: v is None)
    """Granted: as in `LeaseReply`. Left out with `error`."""
    ttl_s: int | None = Field(default=None, ge=1, exclude_if=lambda v: v is None)
    """Granted: as in `LeaseReply`. Left out with `error`."""
    cancel_requested: bool = False
    """Granted: as in `LeaseReply`."""
    stop: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Granted: as in `LeaseReply`. Left out when null."""
    error: ErrorDetail | None = Field(default=None, exclude_if=lambda v: v is None)
    """Not granted: the error `renew` would have answered (`lease_expired`, `lease_foreign`, `not_found`,
    ...); the lease is lost exactly as after that reply. Left out when granted."""


class RenewalsReply(ReplyModel):
    """Answer to `renewals`: one outcome per lease, in the request's order."""

    leases: list[RenewalOutcome]
    """Each lease's outcome."""


class LeaseReply(ReplyModel):
    """Answer to claim and renew."""

    expires_at: Timestamp
    """New expiry (database clock); for display only: agents schedule from `ttl_s`."""
    ttl_s: int = Field(ge=1)
    """Lease length in seconds; the agent renews at about a third of it on its monotonic clock."""
    cancel_requested: bool
    """Whether a cancellation request is pending: stop at the next step boundary."""
    stop: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """Addition: `attempt_timeout` or `deadline_exceeded` when the attempt ran past the task's time limit: stop
    as for a cancellation (teardown runs) and report `failed` with this reason. Left out when null."""


class ReportRequest(LeaseRequest):
    """`P.host.<host_id>.report`: how the attempt ended."""

    outcome: Lax[Outcome]
    """`done`, `failed`, or `cancelled` (only when the host stopped for a cancellation request)."""
    reason: Reason | None = None
    """The agent's explanation, kept as the task's `reason`. At most 1024 characters."""
    result: RunResult | None = None
    """Every step of the plan in order with its status."""
    take_next: bool = Field(default=False, exclude_if=lambda take: not take)
    """Hand the device's next attempt to this host in the reply (an addition: `ReportReply.next`), already
    dispatched; sent only to a scheduler whose register or heartbeat reply said `take_next`, and only while
    the device may take more work. Left out when false, so a report without it is the one an older
    scheduler takes."""


class HandedAttempt(Assignment):
    """The next attempt on the reported attempt's device (an addition), handed to the host already dispatched.

    Its assignment's fields (no claim is needed: `ttl_s` runs from the report's answer) and what the grant
    of its claim, with the first step's progress, would have said: the host runs it as if it had claimed
    it; no assignment of it comes through JetStream.
    """

    cancel_requested: bool = False
    """As in `LeaseReply`."""
    stop: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """As in `LeaseReply`."""


class ReportReply(ReplyModel):
    """Answer to a report; a duplicate gets the first report's answer."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt."""
    status: Lax[TaskStatus]
    """The task's status after the report."""
    recorded_at: Timestamp
    """When the (first) report was recorded."""
    duplicate: bool = False
    """True when this attempt had already recorded the same outcome."""
    next: HandedAttempt | None = Field(default=None, exclude_if=lambda v: v is None)
    """Addition, only for a report with `take_next`: the device's next attempt, already dispatched to this
    host. A duplicate's reply carries it again while it is still to run. Left out when null."""


class ReportsRequest(RequestModel):
    """`P.host.<host_id>.reports` (an addition): several of the host's reports in one request.

    Each entry is what a `report` request would carry. Sent only to a scheduler whose register or heartbeat
    reply said `reports`; an older scheduler does not serve the subject.
    """

    reports: list[ReportRequest] = Field(min_length=1, max_length=MAX_REPORTS_PER_REQUEST)
    """The reports, each attempt named once."""

    @field_validator("reports")
    @classmethod
    def _each_once(cls, reports: list[ReportRequest]) -> list[ReportRequest]:
        _each_attempt_once(reports, "duplicate_report")
        return reports


class ReportOutcome(ReplyModel):
    """One report's answer in a `reports` reply: what `report` would have answered it, reply or error."""

    task_id: Id
    """The task, as named in the request."""
    attempt: int = Field(ge=1)
    """The attempt, as named in the request."""
    lease_id: Id
    """The lease, as named in the request."""
    status: Lax[TaskStatus] | None = Field(default=None, exclude_if=lambda v: v is None)
    """Recorded: as in `ReportReply`. Left out with `error`."""
    recorded_at: Timestamp | None = Field(default=None, exclude_if=lambda v: v is None)
    """Recorded: as in `ReportReply`. Left out with `error`."""
    duplicate: bool = False
    """Recorded: as in `ReportReply`."""
    next: HandedAttempt | None = Field(default=None, exclude_if=lambda v: v is None)
    """Recorded, for a report with `take_next`: as in `ReportReply`. Left out when null."""
    error: ErrorDetail | None = Field(default=None, exclude_if=lambda v: v is None)
    """Not recorded: the error `report` would have answered (`lease_expired`, `lease_foreign`, `not_found`,
    `outcome_conflict`, ...), with nothing changed, exactly as after that reply. Left out when recorded."""


class ReportsReply(ReplyModel):
    """Answer to `reports`: one outcome per report, in the request's order."""

    reports: list[ReportOutcome]
    """Each report's outcome."""


class ReleaseRequest(LeaseRequest):
    """`P.host.<host_id>.release` (an addition): give the attempt back instead of ending the task.

    The host vouches that nothing of the attempt runs on the device any more (its steps were stopped at a
    step boundary, or killed), so the device is free at once and the task is queued again.
    """

    reason: Reason | None = None
    """Why the host gives it back (`agent shutting down`, ...), kept on the attempt. At most 1024 characters."""
    result: RunResult | None = None
    """The steps so far, as in a report (the ones not run are `skipped`)."""


class ReleaseReply(ReplyModel):
    """Answer to a release; a repeat gets the first release's `recorded_at`."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt released."""
    status: Lax[TaskStatus]
    """The task's status after the release: `queued`, or `cancelled` / `failed` when it ended the task
    (for a duplicate: the task's status now)."""
    recorded_at: Timestamp
    """When the (first) release was recorded."""
    duplicate: bool = False
    """True when this lease had already released the attempt."""
