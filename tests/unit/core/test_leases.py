"""Lease rules: claim, renew and report against the live lease, and the conflict precedence order."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from devsched.core.errors import (
    CancelNotRequested,
    Conflict,
    LeaseExpired,
    LeaseForeign,
    LeaseSuperseded,
    OutcomeConflict,
    TaskTerminal,
)
from devsched.core.leases import (
    Extension,
    ReleaseDecision,
    ReportDecision,
    ReportKind,
    decide_claim,
    decide_release,
    decide_renew,
    decide_report,
)
from devsched.core.lifecycle import Trigger
from devsched.core.records import AttemptRecord, LeaseRef, TaskRecord
from devsched.core.status import IN_FLIGHT, TERMINAL, AttemptStatus, Outcome, TaskReason, TaskStatus

from .factories import HOST, OTHER_HOST, T0, TTL, attempt, expired_as, in_flight, ref_for, task

pytestmark = pytest.mark.unit

A, D = TaskStatus.ASSIGNED, TaskStatus.DISPATCHED
EXPIRES = T0 + timedelta(seconds=TTL)
US = timedelta(microseconds=1)
BEFORE = EXPIRES - US


#: Stands for "the task's current attempt" where a helper's `named` is not given (None means "no such attempt").
CURRENT = attempt(0)


def _named(t: TaskRecord, named: AttemptRecord | None) -> AttemptRecord | None:
    return t.current if named is CURRENT else named


def claim(
    t: TaskRecord, ref: LeaseRef | None = None, now: datetime = T0, named: AttemptRecord | None = CURRENT
) -> Extension:
    return decide_claim(t, _named(t, named), ref or ref_for(t), now)


def renew(
    t: TaskRecord, ref: LeaseRef | None = None, now: datetime = T0, named: AttemptRecord | None = CURRENT
) -> Extension:
    return decide_renew(t, _named(t, named), ref or ref_for(t), now)


def report(
    t: TaskRecord,
    outcome: Outcome,
    *,
    ref: LeaseRef | None = None,
    now: datetime = T0,
    named: AttemptRecord | None = CURRENT,
    cancel_requested: bool = False,
) -> ReportDecision:
    return decide_report(
        t, _named(t, named), ref or ref_for(t), outcome, now, cancel_requested_for_attempt=cancel_requested
    )


Extend = Callable[..., Extension]
EXTENDERS = pytest.mark.parametrize("extend", [claim, renew], ids=["claim", "renew"])


def ended(t: TaskRecord, outcome: Outcome) -> TaskRecord:
    """`t` after its current attempt reported `outcome`."""
    assert t.current is not None
    return replace(t, status=outcome.task_status, current=replace(t.current, status=outcome.attempt_status))


def requeued_and_reassigned(t: TaskRecord) -> tuple[TaskRecord, AttemptRecord]:
    """`t` after its attempt expired, was requeued and a new attempt made; returns it and the old one."""
    assert t.current is not None
    old = replace(t.current, status=AttemptStatus.EXPIRED)
    new = attempt(old.attempt + 1, device_id="dev-2", expires_at=EXPIRES + timedelta(seconds=60))
    return replace(t, status=A, attempt_count=new.attempt, current=new), old


# --- claim -------------------------------------------------------------------------------------


def test_claim_of_an_assigned_attempt_dispatches() -> None:
    t = in_flight(A)
    assert claim(t, now=T0) == Extension(
        expires_at=T0 + timedelta(seconds=TTL), ttl_s=TTL, cancel_requested=False, dispatch=True
    )


def test_reclaim_of_a_dispatched_attempt_is_a_renewal() -> None:
    t = in_flight(D)
    now = T0 + timedelta(seconds=10)
    assert claim(t, now=now) == Extension(
        expires_at=now + timedelta(seconds=TTL), ttl_s=TTL, cancel_requested=False, dispatch=False
    )


@pytest.mark.parametrize("status", [A, D])
def test_claim_surfaces_a_pending_cancellation(status: TaskStatus) -> None:
    assert claim(in_flight(status, cancel_requested=True)).cancel_requested is True


# --- renew -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [A, D])
def test_lease_renewal_succeeds(status: TaskStatus) -> None:
    # host-agent spec: extends the expiry without changing the attempt or device (nor the status).
    t = in_flight(status)
    now = T0 + timedelta(seconds=29)
    ext = renew(t, now=now)
    assert ext.expires_at == now + timedelta(seconds=TTL)
    assert ext.ttl_s == TTL
    assert ext.dispatch is False


def test_renewal_on_a_task_with_a_pending_cancellation() -> None:
    ext = renew(in_flight(D, cancel_requested=True))
    assert ext == Extension(EXPIRES, TTL, cancel_requested=True)


def test_renewal_on_a_task_without_a_pending_cancellation() -> None:
    ext = renew(in_flight(D, cancel_requested=False))
    assert ext == Extension(EXPIRES, TTL, cancel_requested=False)


@settings(max_examples=50, deadline=None)
@given(
    ttl=st.integers(1, 3600),
    before=st.timedeltas(min_value=US, max_value=timedelta(hours=2)),
    cancel=st.booleans(),
    status=st.sampled_from([A, D]),
)
def test_renew_returns_now_plus_ttl_and_the_cancel_flag(
    ttl: int, before: timedelta, cancel: bool, status: TaskStatus
) -> None:
    t = replace(in_flight(status, cancel_requested=cancel), lease_ttl_s=ttl)
    now = EXPIRES - before
    assert renew(t, now=now) == Extension(now + timedelta(seconds=ttl), ttl, cancel, dispatch=False)


# --- claim and renew: conflicts ---------------------------------------------------------------


@EXTENDERS
def test_other_attempt_number_is_superseded(extend: Extend) -> None:
    t, old = requeued_and_reassigned(in_flight(D))
    with pytest.raises(LeaseSuperseded) as info:
        extend(t, ref_for(t, old), named=old)
    assert info.value.details == {"current_attempt": 2}


@EXTENDERS
def test_other_lease_id_is_superseded(extend: Extend) -> None:
    t = in_flight(D)
    with pytest.raises(LeaseSuperseded):
        extend(t, ref_for(t, lease_id=uuid.uuid4()))


@EXTENDERS
@pytest.mark.parametrize("number", [0, 2, 7])
def test_attempt_that_never_existed_is_superseded(extend: Extend, number: int) -> None:
    t = in_flight(D)
    ref = ref_for(t, attempt=number)
    with pytest.raises(LeaseSuperseded):
        extend(t, ref, named=None)


@EXTENDERS
def test_task_without_any_attempt_is_superseded(extend: Extend) -> None:
    t = task(TaskStatus.QUEUED)
    with pytest.raises(LeaseSuperseded):
        extend(t, LeaseRef(HOST, t.task_id, 1, uuid.uuid4()), named=None)


@EXTENDERS
def test_foreign_host_is_rejected(extend: Extend) -> None:
    t = in_flight(D)
    with pytest.raises(LeaseForeign) as info:
        extend(t, ref_for(t, host_id=OTHER_HOST))
    assert info.value.details == {"host_id": OTHER_HOST, "owner": HOST}


@EXTENDERS
def test_foreign_wins_over_superseded(extend: Extend) -> None:
    t, old = requeued_and_reassigned(in_flight(D))
    with pytest.raises(LeaseForeign):
        extend(t, ref_for(t, old, host_id=OTHER_HOST), named=old)


@EXTENDERS
@pytest.mark.parametrize("outcome", list(Outcome))
def test_terminal_task_is_rejected(extend: Extend, outcome: Outcome) -> None:
    # scheduler-repository spec: "no further assignment, claim, or lease-renewal operation is accepted".
    t = ended(in_flight(D), outcome)
    with pytest.raises(TaskTerminal) as info:
        extend(t)
    assert info.value.details == {"status": outcome.value}


@EXTENDERS
@pytest.mark.parametrize("status", [TaskStatus.FAILED, TaskStatus.CANCELLED])
def test_task_ended_by_expiry_is_terminal_before_expired(extend: Extend, status: TaskStatus) -> None:
    t = expired_as(status)
    with pytest.raises(TaskTerminal):
        extend(t, now=EXPIRES + timedelta(hours=1))


@EXTENDERS
def test_lease_is_live_until_just_before_expires_at(extend: Extend) -> None:
    assert extend(in_flight(D), now=BEFORE).expires_at == BEFORE + timedelta(seconds=TTL)


@EXTENDERS
@pytest.mark.parametrize("late", [timedelta(0), US, timedelta(hours=1)], ids=["at", "1us-after", "1h-after"])
def test_lease_is_expired_at_and_after_expires_at(extend: Extend, late: timedelta) -> None:
    with pytest.raises(LeaseExpired) as info:
        extend(in_flight(D), now=EXPIRES + late)
    assert info.value.details == {"expires_at": EXPIRES.isoformat()}


@EXTENDERS
@pytest.mark.parametrize("task_status", [A, D, TaskStatus.QUEUED])
def test_attempt_ended_as_expired_is_expired_even_before_its_time(extend: Extend, task_status: TaskStatus) -> None:
    t = task(task_status, attempt(1, status=AttemptStatus.EXPIRED))
    with pytest.raises(LeaseExpired):
        extend(t, now=T0)


def test_lease_is_stale_or_foreign() -> None:
    # host-agent spec: expired, replaced or differently owned -> conflict, nothing revived or altered.
    t = in_flight(D)
    newer, old = requeued_and_reassigned(t)
    cases = [
        (t, ref_for(t), t.current, EXPIRES, LeaseExpired),
        (newer, ref_for(newer, old), old, T0, LeaseSuperseded),
        (t, ref_for(t, host_id=OTHER_HOST), t.current, T0, LeaseForeign),
    ]
    for record, ref, named, now, error in cases:
        before = (record, named)
        with pytest.raises(error):
            decide_renew(record, named, ref, now)
        assert (record, named) == before


# --- report ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [A, D])
@pytest.mark.parametrize("outcome", [Outcome.DONE, Outcome.FAILED])
def test_active_lease_reports_completion(status: TaskStatus, outcome: Outcome) -> None:
    assert report(in_flight(status), outcome) == ReportDecision(
        ReportKind.ACCEPT, outcome.task_status, outcome.attempt_status
    )


def test_report_a_successful_result() -> None:
    assert report(in_flight(D), Outcome.DONE) == ReportDecision(ReportKind.ACCEPT, TaskStatus.DONE, AttemptStatus.DONE)


@pytest.mark.parametrize("status", [A, D])
def test_report_a_cancelled_result(status: TaskStatus) -> None:
    t = in_flight(status, cancel_requested=True)
    assert report(t, Outcome.CANCELLED, cancel_requested=True) == ReportDecision(
        ReportKind.ACCEPT, TaskStatus.CANCELLED, AttemptStatus.CANCELLED
    )


@pytest.mark.parametrize("outcome", [Outcome.DONE, Outcome.FAILED])
def test_done_or_failed_is_accepted_with_a_cancellation_pending(outcome: Outcome) -> None:
    # The agent may finish (or fail) a non-interruptible step before it sees the request.
    t = in_flight(D, cancel_requested=True)
    assert report(t, outcome, cancel_requested=True).kind is ReportKind.ACCEPT


@pytest.mark.parametrize("task_flag", [False, True])
def test_cancelled_report_without_a_request_is_cancel_not_requested(task_flag: bool) -> None:
    t = in_flight(D, cancel_requested=task_flag)
    with pytest.raises(CancelNotRequested):
        report(t, Outcome.CANCELLED, cancel_requested=False)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_retry_a_result_after_response_loss(outcome: Outcome) -> None:
    # host-agent spec: the identical repeat returns the recorded result, no new attempt, no error.
    t = ended(in_flight(D, cancel_requested=True), outcome)
    decision = report(t, outcome, cancel_requested=True)
    assert decision == ReportDecision(ReportKind.DUPLICATE, outcome.task_status, outcome.attempt_status)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_duplicate_report_is_answered_long_after_the_lease_expired(outcome: Outcome) -> None:
    t = ended(in_flight(D), outcome)
    assert report(t, outcome, now=EXPIRES + timedelta(days=1), cancel_requested=True).kind is ReportKind.DUPLICATE


@pytest.mark.parametrize(
    ("recorded", "reported"),
    [(r, o) for r in Outcome for o in Outcome if r is not o],
)
def test_different_outcome_is_outcome_conflict(recorded: Outcome, reported: Outcome) -> None:
    t = ended(in_flight(D), recorded)
    with pytest.raises(OutcomeConflict) as info:
        report(t, reported, cancel_requested=True)
    assert info.value.details == {"recorded": recorded.value, "reported": reported.value}


def test_outcome_conflict_wins_over_cancel_not_requested() -> None:
    t = ended(in_flight(D), Outcome.DONE)
    with pytest.raises(OutcomeConflict):
        report(t, Outcome.CANCELLED, cancel_requested=False)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_stale_attempt_reports_after_requeue(outcome: Outcome) -> None:
    # host-agent spec: the expired earlier attempt is rejected; the newer attempt is preserved.
    newer, old = requeued_and_reassigned(in_flight(D))
    with pytest.raises(LeaseSuperseded):
        report(newer, outcome, ref=ref_for(newer, old), named=old, now=T0, cancel_requested=True)


def test_superseded_lease_reports_completion() -> None:
    # scheduler-repository spec: a lease superseded by expiry and retry cannot overwrite the current attempt.
    newer, old = requeued_and_reassigned(in_flight(D))
    newer = replace(newer, status=D)
    with pytest.raises(LeaseSuperseded):
        report(newer, Outcome.DONE, ref=ref_for(newer, old), named=old)
    # and the current attempt still reports normally afterwards
    assert report(newer, Outcome.DONE).kind is ReportKind.ACCEPT


@pytest.mark.parametrize(
    "ref_change", [{"lease_id": None}, {"attempt": 2}, {"attempt": 0}], ids=["lease", "attempt+1", "attempt0"]
)
def test_report_with_a_stale_ref_is_superseded(ref_change: dict[str, object]) -> None:
    t = in_flight(D)
    changes = {k: (v if v is not None else uuid.uuid4()) for k, v in ref_change.items()}
    ref = ref_for(t, None, **changes)
    named = t.current if ref.attempt == 1 else None
    with pytest.raises(LeaseSuperseded):
        decide_report(t, named, ref, Outcome.DONE, T0, cancel_requested_for_attempt=False)


def test_report_from_a_foreign_host() -> None:
    t = in_flight(D)
    with pytest.raises(LeaseForeign):
        report(t, Outcome.DONE, ref=ref_for(t, host_id=OTHER_HOST))


def test_report_from_an_expired_attempt_before_a_new_one_exists() -> None:
    t = expired_as(TaskStatus.QUEUED)
    with pytest.raises(LeaseExpired):
        report(t, Outcome.DONE, now=T0)


@pytest.mark.parametrize("outcome", [Outcome.DONE, Outcome.FAILED])
def test_report_at_expires_at_is_expired(outcome: Outcome) -> None:
    t = in_flight(D)
    assert report(t, outcome, now=BEFORE).kind is ReportKind.ACCEPT
    with pytest.raises(LeaseExpired):
        report(t, outcome, now=EXPIRES)


@pytest.mark.parametrize("status", [TaskStatus.FAILED, TaskStatus.CANCELLED])
def test_report_against_a_task_ended_by_expiry_is_task_terminal(status: TaskStatus) -> None:
    t = expired_as(status)
    with pytest.raises(TaskTerminal):
        report(t, Outcome.DONE, now=EXPIRES + timedelta(seconds=1))


def test_cancel_not_requested_wins_over_task_terminal() -> None:
    t = expired_as(TaskStatus.FAILED)
    with pytest.raises(CancelNotRequested):
        report(t, Outcome.CANCELLED, cancel_requested=False)


# --- the precedence order, as a property -------------------------------------------------------

RECORDED = (AttemptStatus.DONE, AttemptStatus.FAILED, AttemptStatus.CANCELLED)


@st.composite
def conflicts(draw: st.DrawFn) -> dict[str, object]:
    """A random combination of the conditions PROTOCOL.md ranks, realised as records and a ref."""
    op = draw(st.sampled_from(["claim", "renew", "report"]))
    # Each condition is drawn rarely enough that the later ones in the order are reached often.
    superseded = draw(st.sampled_from([None, None, None, None, "older-attempt", "other-lease", "never-existed"]))
    n = draw(st.integers(2 if superseded == "older-attempt" else 1, 5))
    foreign = draw(st.sampled_from([False, False, False, True]))
    recorded = draw(st.sampled_from([None, None, None, *Outcome]))
    outcome = draw(st.sampled_from(list(Outcome)))
    cancel_for_attempt = draw(st.booleans())
    terminal = draw(st.sampled_from([False, False, True]))
    expired = draw(st.sampled_from([None, None, "attempt-expired", "at-expiry", "after-expiry"]))
    ttl = draw(st.integers(1, 100))
    offset = draw(st.timedeltas(min_value=US, max_value=timedelta(hours=1)))

    if recorded is not None:
        named_status = recorded.attempt_status
    elif expired == "attempt-expired":
        named_status = AttemptStatus.EXPIRED
    else:
        named_status = AttemptStatus.ACTIVE
    if terminal:
        task_status = draw(st.sampled_from(sorted(TERMINAL)))
    elif named_status is AttemptStatus.EXPIRED:
        task_status = draw(st.sampled_from([A, D, TaskStatus.QUEUED]))
    else:
        task_status = draw(st.sampled_from(sorted(IN_FLIGHT)))
    now = {"at-expiry": EXPIRES, "after-expiry": EXPIRES + offset}.get(expired or "", EXPIRES - offset)

    if superseded == "older-attempt":
        number = draw(st.integers(1, n - 1))
    elif superseded == "never-existed":
        number = n + draw(st.integers(1, 3))
    else:
        number = n
    named: AttemptRecord | None = None
    if superseded != "never-existed":
        named = attempt(number, status=named_status, host_id=OTHER_HOST if foreign else HOST)
    current = named if number == n else attempt(n)
    t = task(task_status, current, attempt_count=n, lease_ttl_s=ttl, cancel_requested=draw(st.booleans()))
    ref = LeaseRef(
        host_id=HOST,
        task_id=t.task_id,
        attempt=number,
        lease_id=uuid.uuid4() if superseded == "other-lease" or named is None else named.lease_id,
    )
    return {
        "op": op,
        "task": t,
        "named": named,
        "ref": ref,
        "outcome": outcome,
        "now": now,
        "cancel_for_attempt": cancel_for_attempt,
        "flags": {
            "foreign": foreign and named is not None,
            "superseded": superseded is not None,
            "recorded": recorded,
            "terminal": terminal,
            # An attempt that ended (expired, or with a recorded outcome) can no longer be extended.
            "expired": expired is not None or recorded is not None,
        },
    }


def first_applicable(op: str, flags: dict[str, object], outcome: Outcome, cancel_for_attempt: bool) -> object:
    """PROTOCOL.md's order: foreign, superseded, (report) recorded outcome, (cancelled report)
    cancel_not_requested, terminal, expired; None when nothing applies."""
    if flags["foreign"]:
        return LeaseForeign
    if flags["superseded"]:
        return LeaseSuperseded
    if op == "report" and flags["recorded"] is not None:
        return ReportKind.DUPLICATE if flags["recorded"] is outcome else OutcomeConflict
    if op == "report" and outcome is Outcome.CANCELLED and not cancel_for_attempt:
        return CancelNotRequested
    if flags["terminal"]:
        return TaskTerminal
    if flags["expired"]:
        return LeaseExpired
    return None


@settings(max_examples=400, deadline=None)
@given(conflicts())
def test_the_first_applicable_conflict_in_protocol_order_is_raised(case: dict[str, object]) -> None:
    t, named, ref, now = case["task"], case["named"], case["ref"], case["now"]
    outcome = case["outcome"]
    assert isinstance(t, TaskRecord)
    assert isinstance(ref, LeaseRef)
    assert isinstance(now, datetime)
    assert isinstance(outcome, Outcome)
    cancel_for_attempt = bool(case["cancel_for_attempt"])
    expected = first_applicable(str(case["op"]), case["flags"], outcome, cancel_for_attempt)  # type: ignore[arg-type]
    event(f"{case['op']}: {getattr(expected, '__name__', expected)}")

    def run() -> object:
        if case["op"] == "claim":
            return decide_claim(t, named, ref, now)  # type: ignore[arg-type]
        if case["op"] == "renew":
            return decide_renew(t, named, ref, now)  # type: ignore[arg-type]
        return decide_report(t, named, ref, outcome, now, cancel_requested_for_attempt=cancel_for_attempt)  # type: ignore[arg-type]

    if isinstance(expected, type):
        with pytest.raises(Conflict) as info:
            run()
        assert type(info.value) is expected
        return
    result = run()
    if expected is ReportKind.DUPLICATE:
        assert result == ReportDecision(ReportKind.DUPLICATE, t.status, outcome.attempt_status)
    elif case["op"] == "report":
        assert result == ReportDecision(ReportKind.ACCEPT, outcome.task_status, outcome.attempt_status)
    else:
        assert result == Extension(
            expires_at=now + timedelta(seconds=t.lease_ttl_s),
            ttl_s=t.lease_ttl_s,
            cancel_requested=t.cancel_requested,
            dispatch=case["op"] == "claim" and t.status is A,
        )


# --- release -----------------------------------------------------------------------------------

MAX_RELEASES = 10


def release(
    t: TaskRecord,
    *,
    ref: LeaseRef | None = None,
    now: datetime = T0,
    named: AttemptRecord | None = CURRENT,
    max_releases: int = MAX_RELEASES,
) -> ReleaseDecision:
    return decide_release(t, _named(t, named), ref or ref_for(t), now, max_releases=max_releases)


def released(t: TaskRecord, status: TaskStatus = TaskStatus.QUEUED) -> TaskRecord:
    """`t` after its current attempt was released, leaving the task in `status`."""
    assert t.current is not None
    return replace(t, status=status, releases=t.releases + 1, current=replace(t.current, status=AttemptStatus.RELEASED))


@pytest.mark.parametrize("status", [A, D])
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_release_of_the_live_lease_requeues(status: TaskStatus, max_attempts: int) -> None:
    t = in_flight(status, max_attempts=max_attempts)
    assert release(t) == ReleaseDecision(ReportKind.ACCEPT, TaskStatus.QUEUED, Trigger.RELEASE, None)


@pytest.mark.parametrize("status", [A, D])
@pytest.mark.parametrize("releases", [0, MAX_RELEASES, MAX_RELEASES + 5])
def test_release_with_a_cancellation_pending_cancels(status: TaskStatus, releases: int) -> None:
    # A pending cancellation wins over the bound on releases, as over the attempt limit on expiry.
    t = replace(in_flight(status, cancel_requested=True), releases=releases)
    assert release(t) == ReleaseDecision(
        ReportKind.ACCEPT, TaskStatus.CANCELLED, Trigger.RELEASE_CANCEL, TaskReason.CANCELLED_AFTER_RELEASE
    )


@pytest.mark.parametrize(("releases", "max_releases"), [(10, 10), (11, 10), (0, 0), (3, 3)])
def test_release_past_the_bound_fails_the_task(releases: int, max_releases: int) -> None:
    t = replace(in_flight(D, n=releases + 1), releases=releases)
    assert release(t, max_releases=max_releases) == ReleaseDecision(
        ReportKind.ACCEPT, TaskStatus.FAILED, Trigger.RELEASE_FAIL, TaskReason.RELEASED_TOO_OFTEN
    )
    assert TaskReason.RELEASED_TOO_OFTEN.value == "released_too_often"


@pytest.mark.parametrize(("releases", "max_releases"), [(9, 10), (0, 1), (2, 3)])
def test_release_below_the_bound_requeues(releases: int, max_releases: int) -> None:
    t = replace(in_flight(D, n=releases + 1), releases=releases)
    assert release(t, max_releases=max_releases).task_status is TaskStatus.QUEUED


@pytest.mark.parametrize("status", [TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED])
def test_identical_repeat_of_a_release_is_a_duplicate(status: TaskStatus) -> None:
    t = released(in_flight(D), status)
    assert release(t, now=EXPIRES + timedelta(days=1)) == ReleaseDecision(ReportKind.DUPLICATE, status)


def test_repeat_of_a_release_after_the_task_was_assigned_again_is_a_duplicate() -> None:
    # The task is requeued at once and may run elsewhere before the host's retry of a lost reply.
    t = released(in_flight(D))
    old = t.current
    assert old is not None
    new = attempt(2, host_id=OTHER_HOST, device_id="dev-2")
    newer = replace(t, status=A, attempt_count=2, current=new)
    assert release(newer, ref=ref_for(newer, old), named=old) == ReleaseDecision(ReportKind.DUPLICATE, A)
    # another host repeating it is still foreign, and another lease of that attempt is superseded
    with pytest.raises(LeaseForeign):
        release(newer, ref=ref_for(newer, old, host_id=OTHER_HOST), named=old)
    with pytest.raises(LeaseSuperseded):
        release(newer, ref=ref_for(newer, old, lease_id=uuid.uuid4()), named=old)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_release_of_a_reported_attempt_is_outcome_conflict(outcome: Outcome) -> None:
    t = ended(in_flight(D, cancel_requested=True), outcome)
    with pytest.raises(OutcomeConflict) as info:
        release(t)
    assert info.value.details == {"recorded": outcome.value, "reported": "released"}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_report_of_a_released_attempt_is_outcome_conflict(outcome: Outcome) -> None:
    t = released(in_flight(D, cancel_requested=True))
    with pytest.raises(OutcomeConflict) as info:
        report(t, outcome, cancel_requested=True)
    assert info.value.details == {"recorded": "released", "reported": outcome.value}


def test_stale_or_foreign_release_is_refused() -> None:
    t = in_flight(D)
    newer, old = requeued_and_reassigned(t)
    cases = [
        (t, ref_for(t), t.current, EXPIRES, LeaseExpired),
        (newer, ref_for(newer, old), old, T0, LeaseSuperseded),
        (t, ref_for(t, host_id=OTHER_HOST), t.current, T0, LeaseForeign),
        (t, ref_for(t, lease_id=uuid.uuid4()), t.current, T0, LeaseSuperseded),
        (expired_as(TaskStatus.FAILED), None, None, T0, TaskTerminal),
    ]
    for record, ref, named, now, error in cases:
        with pytest.raises(error):
            decide_release(record, named or record.current, ref or ref_for(record), now, max_releases=MAX_RELEASES)


def release_expected(flags: dict[str, object], named: AttemptRecord | None, ref: LeaseRef) -> object:
    """PROTOCOL.md's order for a release: foreign, (the same lease released it) duplicate, superseded,
    recorded outcome, terminal, expired; None when nothing applies."""
    if flags["foreign"]:
        return LeaseForeign
    if named is not None and named.status is AttemptStatus.RELEASED and named.lease_id == ref.lease_id:
        return ReportKind.DUPLICATE
    if flags["superseded"]:
        return LeaseSuperseded
    if flags["recorded"] is not None:
        return OutcomeConflict
    if flags["terminal"]:
        return TaskTerminal
    if flags["expired"]:
        return LeaseExpired
    return None


@settings(max_examples=400, deadline=None)
@given(conflicts(), st.booleans(), st.integers(0, 3), st.integers(0, 3))
def test_a_release_raises_the_first_applicable_conflict_in_protocol_order(
    case: dict[str, object], was_released: bool, releases: int, max_releases: int
) -> None:
    t, named, ref, now = case["task"], case["named"], case["ref"], case["now"]
    assert isinstance(t, TaskRecord)
    assert isinstance(ref, LeaseRef)
    assert isinstance(now, datetime)
    assert named is None or isinstance(named, AttemptRecord)
    flags = dict(case["flags"])  # type: ignore[call-overload]
    if was_released and named is not None and flags["recorded"] is None:
        # the named attempt ended as released (by this lease, unless the ref names another one)
        named = replace(named, status=AttemptStatus.RELEASED)
        if named.attempt == t.attempt_count:
            t = replace(t, current=named, status=TaskStatus.QUEUED if t.status in IN_FLIGHT else t.status)
        flags["expired"] = True
    t = replace(t, releases=releases)
    expected = release_expected(flags, named, ref)
    event(f"release: {getattr(expected, '__name__', expected)}")
    if isinstance(expected, type):
        with pytest.raises(Conflict) as info:
            decide_release(t, named, ref, now, max_releases=max_releases)
        assert type(info.value) is expected
        return
    decision = decide_release(t, named, ref, now, max_releases=max_releases)
    if expected is ReportKind.DUPLICATE:
        assert decision == ReleaseDecision(ReportKind.DUPLICATE, t.status)
    elif t.cancel_requested:
        assert decision.task_status is TaskStatus.CANCELLED
    elif releases >= max_releases:
        assert (decision.task_status, decision.reason) == (TaskStatus.FAILED, TaskReason.RELEASED_TOO_OFTEN)
    else:
        assert decision == ReleaseDecision(ReportKind.ACCEPT, TaskStatus.QUEUED, Trigger.RELEASE, None)
