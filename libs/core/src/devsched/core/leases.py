"""Lease rules for claim, renew, report and release: pure decisions from the rows, the request and `now`.

Conflicts are checked in the order PROTOCOL.md fixes, so every caller reports the same code:
not_found -> lease_foreign -> lease_superseded -> (report, release) recorded outcome -> (cancelled report)
cancel_not_requested -> task_terminal -> lease_expired.

A release is a report that gives the attempt back instead of ending the task, and ranks its conflicts
the same way, with one difference: the repeat of a release is recognised (a duplicate) even once a newer
attempt exists, because a released task is requeued at once and may be assigned again before the host's
retry of a release whose reply it lost.

A request is granted when none applies: the named attempt is the task's current one, of the asking host,
with the lease id named; the attempt is `LIVE_ATTEMPT` and `now` is before its expiry; the task is not
in `ENDED_TASK` (and, for a report, can take the report's transition; for a `cancelled` report, a
cancellation was requested on the attempt). The store renders exactly this as the compare-and-set of its
one-statement path (`devsched.store.grants`) from the constants below, and falls back to these
functions to name the conflict when that statement matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from devsched.core.errors import (
    CancelNotRequested,
    LeaseExpired,
    LeaseForeign,
    LeaseSuperseded,
    OutcomeConflict,
    TaskTerminal,
)
from devsched.core.lifecycle import Trigger, next_status, sources
from devsched.core.records import AttemptRecord, LeaseRef, TaskRecord
from devsched.core.retrying import Retry, RetryCause, retries, retry
from devsched.core.status import RECORDED, TERMINAL, AttemptStatus, Outcome, TaskReason, TaskStatus
from devsched.core.timeouts import stop_reason

#: The one attempt status in which a lease may still be used (claimed, renewed, reported).
LIVE_ATTEMPT = AttemptStatus.ACTIVE
#: Task statuses in which no lease may be used any more (`task_terminal`).
ENDED_TASK: frozenset[TaskStatus] = TERMINAL
#: Task statuses a claim moves to dispatched; a claim in any other live status is answered as a renewal.
DISPATCHING: frozenset[TaskStatus] = sources(Trigger.CLAIM)


@dataclass(frozen=True, slots=True)
class Extension:
    """A granted claim or renewal: the new expiry, and whether a cancellation is pending.

    One value on both sides of the wire: the store decides it, the scheduler sends it as `LeaseReply`,
    and the host agent's client reads the reply back into it for its lease keeper.
    """

    expires_at: datetime
    ttl_s: int
    cancel_requested: bool
    #: True only for the first claim, which moves the task from assigned to dispatched.
    dispatch: bool = False
    #: `attempt_timeout` or `deadline_exceeded`: the host must stop the attempt as for a cancellation and
    #: report it failed with this reason (`devsched.core.timeouts`); None otherwise.
    stop: str | None = None


class ReportKind(StrEnum):
    """How a report (or a release) is answered."""

    #: First report (release) of this attempt: record it and end (requeue) the task.
    ACCEPT = "accept"
    #: The same outcome was already recorded: answer with the recorded one, change nothing.
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class ReportDecision:
    """What to do with a report."""

    kind: ReportKind
    task_status: TaskStatus
    attempt_status: AttemptStatus
    #: A failed report the task's retry policy retries: the task is queued again, with its backoff.
    retry: Retry | None = None


#: The transition each reported outcome makes.
REPORT_TRIGGER: Mapping[Outcome, Trigger] = {
    Outcome.DONE: Trigger.REPORT_DONE,
    Outcome.FAILED: Trigger.REPORT_FAILED,
    Outcome.CANCELLED: Trigger.REPORT_CANCELLED,
}
#: Outcomes a host may report only when a cancellation was requested on the attempt.
NEEDS_CANCEL_REQUEST: frozenset[Outcome] = frozenset({Outcome.CANCELLED})


def _check_identity(task: TaskRecord, named: AttemptRecord | None, ref: LeaseRef) -> AttemptRecord:
    """Foreign, then superseded: is `named` this host's and the task's current lease?"""
    if named is not None and named.host_id != ref.host_id:
        raise LeaseForeign(host_id=ref.host_id, owner=named.host_id)
    if named is None or ref.attempt != task.attempt_count or named.lease_id != ref.lease_id:
        raise LeaseSuperseded(current_attempt=task.attempt_count)
    return named


def _check_live(task: TaskRecord, attempt: AttemptRecord, now: datetime) -> None:
    """Terminal, then expired: may the lease still be used at `now`?"""
    if task.status in ENDED_TASK:
        raise TaskTerminal(status=task.status.value)
    if attempt.status is not LIVE_ATTEMPT or now >= attempt.expires_at:
        raise LeaseExpired(expires_at=attempt.expires_at.isoformat())


def _extend(task: TaskRecord, now: datetime, *, dispatch: bool) -> Extension:
    return Extension(
        expires_at=now + timedelta(seconds=task.lease_ttl_s),
        ttl_s=task.lease_ttl_s,
        cancel_requested=task.cancel_requested,
        dispatch=dispatch,
        stop=stop_reason(task, now),
    )


def decide_renew(task: TaskRecord, named: AttemptRecord | None, ref: LeaseRef, now: datetime) -> Extension:
    """Extend a live lease by the task's ttl from `now`; the attempt and device stay as they are.

    Raises:
        LeaseForeign, LeaseSuperseded, TaskTerminal, LeaseExpired: in that order of precedence.
    """
    attempt = _check_identity(task, named, ref)
    _check_live(task, attempt, now)
    return _extend(task, now, dispatch=False)


def decide_claim(task: TaskRecord, named: AttemptRecord | None, ref: LeaseRef, now: datetime) -> Extension:
    """Start an assigned attempt; a repeated claim of a dispatched one is answered as a renewal.

    Raises:
        LeaseForeign, LeaseSuperseded, TaskTerminal, LeaseExpired: in that order of precedence.
    """
    attempt = _check_identity(task, named, ref)
    _check_live(task, attempt, now)
    dispatch = task.status in DISPATCHING
    if dispatch:
        next_status(task.status, Trigger.CLAIM)
    return _extend(task, now, dispatch=dispatch)


def decide_report(
    task: TaskRecord,
    named: AttemptRecord | None,
    ref: LeaseRef,
    outcome: Outcome,
    now: datetime,
    *,
    cancel_requested_for_attempt: bool,
    failure: RetryCause | None = None,
) -> ReportDecision:
    """Accept a terminal report from the live lease, or recognise an identical repeat.

    `cancel_requested_for_attempt` says whether a cancellation request was ever recorded against the
    named attempt (a `cancelled` report needs one). `failure` is what made a `failed` run fail
    (`devsched.core.retrying.failure_cause`): when the task's retry policy retries it and attempts are
    left (and no cancellation is pending), the task is queued again instead of failing.

    Raises:
        LeaseForeign, LeaseSuperseded, OutcomeConflict, CancelNotRequested, TaskTerminal, LeaseExpired.
    """
    attempt = _check_identity(task, named, ref)
    if attempt.status in RECORDED:
        if attempt.status is outcome.attempt_status:
            return ReportDecision(ReportKind.DUPLICATE, task.status, attempt.status)
        raise OutcomeConflict(recorded=attempt.status.value, reported=outcome.value)
    if outcome in NEEDS_CANCEL_REQUEST and not cancel_requested_for_attempt:
        raise CancelNotRequested()
    _check_live(task, attempt, now)
    if (
        outcome is Outcome.FAILED
        and task.retry is not None
        and failure is not None
        and retries(task.retry, failure)
        and task.attempts_spent < task.max_attempts
        and not task.cancel_requested
    ):
        again = retry(task.retry, failure, task.attempt_count, attempt.device_id, now)
        return ReportDecision(
            ReportKind.ACCEPT, next_status(task.status, Trigger.REPORT_RETRY), outcome.attempt_status, again
        )
    status = next_status(task.status, REPORT_TRIGGER[outcome])
    return ReportDecision(ReportKind.ACCEPT, status, outcome.attempt_status)


@dataclass(frozen=True, slots=True)
class ReleaseDecision:
    """What to do with a release: the task's next status, and the trigger and reason that lead there.

    A duplicate changes nothing and carries the task's status as it is now (`trigger` and `reason` None).
    """

    kind: ReportKind
    task_status: TaskStatus
    trigger: Trigger | None = None
    reason: TaskReason | None = None
    #: With a retry policy that retries releases: when the task may run again, and the device to avoid.
    retry: Retry | None = None


def decide_release(
    task: TaskRecord, named: AttemptRecord | None, ref: LeaseRef, now: datetime, *, max_releases: int
) -> ReleaseDecision:
    """Take an attempt back from its live lease: requeue the task, or cancel it, or fail it past the bound.

    The host vouches that nothing runs on the device any more, so the attempt ends `released` and the
    device is free at once; the attempt does not count against `max_attempts`. A pending cancellation
    wins (the task ends `cancelled`, reason `cancelled_after_release`); otherwise a task released
    `max_releases` times already ends `failed` (`released_too_often`); otherwise it is queued again.

    Raises:
        LeaseForeign, LeaseSuperseded, OutcomeConflict, TaskTerminal, LeaseExpired: in that order of
            precedence (an attempt this lease already released is a duplicate right after LeaseForeign).
    """
    if named is not None and named.host_id != ref.host_id:
        raise LeaseForeign(host_id=ref.host_id, owner=named.host_id)
    if named is not None and named.status is AttemptStatus.RELEASED and named.lease_id == ref.lease_id:
        return ReleaseDecision(ReportKind.DUPLICATE, task.status)
    attempt = _check_identity(task, named, ref)
    if attempt.status in RECORDED:
        raise OutcomeConflict(recorded=attempt.status.value, reported=AttemptStatus.RELEASED.value)
    _check_live(task, attempt, now)
    if task.cancel_requested:
        trigger, reason = Trigger.RELEASE_CANCEL, TaskReason.CANCELLED_AFTER_RELEASE
    elif task.releases >= max_releases:
        trigger, reason = Trigger.RELEASE_FAIL, TaskReason.RELEASED_TOO_OFTEN
    elif not retries(task.retry, RetryCause.RELEASED):
        trigger, reason = Trigger.RELEASE_FAIL, TaskReason.RELEASED
    else:
        trigger, reason = Trigger.RELEASE, None
        if task.retry is not None:
            again = retry(task.retry, RetryCause.RELEASED, task.attempt_count, attempt.device_id, now)
            return ReleaseDecision(ReportKind.ACCEPT, next_status(task.status, trigger), trigger, reason, again)
    return ReleaseDecision(ReportKind.ACCEPT, next_status(task.status, trigger), trigger, reason)
