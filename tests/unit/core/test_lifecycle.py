"""The lifecycle table against ARCHITECTURE.md's, pair by pair."""

from __future__ import annotations

import itertools

import pytest

from devsched.core.errors import DevschedError, IllegalTransition
from devsched.core.lifecycle import TRANSITIONS, Trigger, next_status, sources
from devsched.core.status import IN_FLIGHT, TERMINAL, TaskStatus

pytestmark = pytest.mark.unit

Q, A, D = TaskStatus.QUEUED, TaskStatus.ASSIGNED, TaskStatus.DISPATCHED
DONE, FAILED, CANCELLED = TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED

# ARCHITECTURE.md "Task lifecycle", row by row, written out independently of the code under test.
# The in-flight cancel row ("same; a cancellation request is recorded") and the re-claim of a
# dispatched attempt (answered as a renewal) change no status, so they are not moves.
EXPECTED: dict[tuple[TaskStatus | None, Trigger], TaskStatus] = {
    (None, Trigger.SUBMIT): Q,
    (Q, Trigger.ASSIGN): A,
    (A, Trigger.CLAIM): D,
    (A, Trigger.REPORT_DONE): DONE,
    (D, Trigger.REPORT_DONE): DONE,
    (A, Trigger.REPORT_FAILED): FAILED,
    (D, Trigger.REPORT_FAILED): FAILED,
    (A, Trigger.REPORT_CANCELLED): CANCELLED,
    (D, Trigger.REPORT_CANCELLED): CANCELLED,
    (A, Trigger.EXPIRE_REQUEUE): Q,
    (D, Trigger.EXPIRE_REQUEUE): Q,
    (A, Trigger.EXPIRE_FAIL): FAILED,
    (D, Trigger.EXPIRE_FAIL): FAILED,
    (A, Trigger.EXPIRE_CANCEL): CANCELLED,
    (D, Trigger.EXPIRE_CANCEL): CANCELLED,
    (Q, Trigger.CANCEL): CANCELLED,
    # "the owning host releases the attempt (agent shutdown, drain): queued (or cancelled if a cancellation
    # is pending)", and failed past the bound on releases (`released_too_often`).
    (A, Trigger.RELEASE): Q,
    (D, Trigger.RELEASE): Q,
    (A, Trigger.RELEASE_CANCEL): CANCELLED,
    (D, Trigger.RELEASE_CANCEL): CANCELLED,
    (A, Trigger.RELEASE_FAIL): FAILED,
    (D, Trigger.RELEASE_FAIL): FAILED,
    # "queued -> failed (reason queue_timeout): no device within the task's queue_timeout_s"
    (Q, Trigger.QUEUE_TIMEOUT): FAILED,
    # "assigned, dispatched -> failed (reason attempt_timeout) or retried by the task's retry policy", and
    # a pending cancellation winning as it does at an expiry
    (A, Trigger.ATTEMPT_TIMEOUT): FAILED,
    (D, Trigger.ATTEMPT_TIMEOUT): FAILED,
    (A, Trigger.ATTEMPT_TIMEOUT_RETRY): Q,
    (D, Trigger.ATTEMPT_TIMEOUT_RETRY): Q,
    (A, Trigger.TIMEOUT_CANCEL): CANCELLED,
    (D, Trigger.TIMEOUT_CANCEL): CANCELLED,
    # the deadline, across all attempts: queued or in flight
    (Q, Trigger.DEADLINE): FAILED,
    (A, Trigger.DEADLINE): FAILED,
    (D, Trigger.DEADLINE): FAILED,
    # a failed report that the retry policy retries
    (A, Trigger.REPORT_RETRY): Q,
    (D, Trigger.REPORT_RETRY): Q,
}

ALL_PAIRS = list(itertools.product([None, *TaskStatus], Trigger))
ALLOWED = [pair for pair in ALL_PAIRS if pair in EXPECTED]
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in EXPECTED]


def _id(pair: tuple[TaskStatus | None, Trigger]) -> str:
    return f"{pair[0] or 'new'}-{pair[1]}"


@pytest.mark.parametrize("pair", ALLOWED, ids=_id)
def test_every_row_of_the_table_is_allowed(pair: tuple[TaskStatus | None, Trigger]) -> None:
    assert next_status(*pair) is EXPECTED[pair]


@pytest.mark.parametrize("pair", FORBIDDEN, ids=_id)
def test_every_other_pair_raises_illegal_transition(pair: tuple[TaskStatus | None, Trigger]) -> None:
    with pytest.raises(IllegalTransition) as info:
        next_status(*pair)
    assert str(pair[1]) in str(info.value)


def test_the_table_is_exactly_the_architecture_table() -> None:
    assert dict(TRANSITIONS) == EXPECTED
    assert len(ALLOWED) + len(FORBIDDEN) == (len(TaskStatus) + 1) * len(Trigger)


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_terminal_statuses_have_no_outgoing_transitions(status: TaskStatus) -> None:
    assert not [trigger for (src, trigger) in TRANSITIONS if src is status]
    for trigger in Trigger:
        with pytest.raises(IllegalTransition):
            next_status(status, trigger)


def test_every_status_is_reachable_from_submit() -> None:
    seen: set[TaskStatus | None] = {None}
    frontier: list[TaskStatus | None] = [None]
    while frontier:
        src = frontier.pop()
        for (s, _), dst in TRANSITIONS.items():
            if s == src and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen - {None} == set(TaskStatus)


def test_cancelled_is_reachable_from_queued_assigned_and_dispatched() -> None:
    # scheduler-repository spec: "Cancelled status is a valid terminal state".
    reach = {src for (src, _), dst in TRANSITIONS.items() if dst is CANCELLED}
    assert reach == {Q, A, D}


@pytest.mark.parametrize(
    ("trigger", "expected"),
    [
        (Trigger.SUBMIT, frozenset()),
        (Trigger.ASSIGN, frozenset({Q})),
        (Trigger.CLAIM, frozenset({A})),
        (Trigger.CANCEL, frozenset({Q})),
        (Trigger.REPORT_DONE, IN_FLIGHT),
        (Trigger.REPORT_FAILED, IN_FLIGHT),
        (Trigger.REPORT_CANCELLED, IN_FLIGHT),
        (Trigger.EXPIRE_REQUEUE, IN_FLIGHT),
        (Trigger.EXPIRE_FAIL, IN_FLIGHT),
        (Trigger.EXPIRE_CANCEL, IN_FLIGHT),
        (Trigger.RELEASE, IN_FLIGHT),
        (Trigger.RELEASE_CANCEL, IN_FLIGHT),
        (Trigger.RELEASE_FAIL, IN_FLIGHT),
    ],
)
def test_sources(trigger: Trigger, expected: frozenset[TaskStatus]) -> None:
    assert sources(trigger) == expected


@pytest.mark.parametrize("trigger", list(Trigger))
def test_sources_agree_with_next_status(trigger: Trigger) -> None:
    for status in TaskStatus:
        allowed = status in sources(trigger)
        try:
            next_status(status, trigger)
        except IllegalTransition:
            assert not allowed
        else:
            assert allowed


def test_illegal_transition_is_an_internal_error() -> None:
    assert issubclass(IllegalTransition, DevschedError)
    assert IllegalTransition.code == "internal"
    assert IllegalTransition.status == 500
    assert not IllegalTransition.retryable


def test_status_sets() -> None:
    assert {D, A} == IN_FLIGHT
    assert {DONE, FAILED, CANCELLED} == TERMINAL
    assert not IN_FLIGHT & TERMINAL
    assert set(TaskStatus) == IN_FLIGHT | TERMINAL | {Q}
