"""A pure in-memory scheduler built only from the core rules, driven by hypothesis.

The model stores what the database would (tasks, attempts, end reasons, cancellation requests,
reservations) and applies only what the core decides; the invariants are ARCHITECTURE.md's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from devsched.core.cancellation import CancelKind, decide_cancel
from devsched.core.errors import Conflict
from devsched.core.expiry import decide_expiry, is_expired
from devsched.core.ids import new_lease_id, new_task_id
from devsched.core.leases import ReportKind, decide_claim, decide_release, decide_renew, decide_report
from devsched.core.lifecycle import Trigger, next_status
from devsched.core.matching import matches, plan_assignments
from devsched.core.records import AttemptRecord, DeviceRecord, LeaseRef, QueuedTask, Selector, TaskRecord
from devsched.core.status import (
    IN_FLIGHT,
    TERMINAL,
    AttemptStatus,
    EndReason,
    Outcome,
    TaskReason,
    TaskStatus,
)

from .factories import T0

pytestmark = pytest.mark.unit

DEVICES = [
    DeviceRecord("d1", "h1", {"platform": "android"}),
    DeviceRecord("d2", "h1", {"platform": "ios"}),
    DeviceRecord("d3", "h2", {"platform": "android"}),
]
HOSTS = ["h1", "h2"]
SELECTORS = [
    Selector(),
    Selector({"platform": "android"}),
    Selector({"platform": "ios"}),
    Selector(device_id="d3"),
    Selector({"platform": "windows"}),  # never matches: stays queued
]
#: How a host names an attempt: the true current lease, or one of the ways of getting it wrong.
REFS = ["current", "current", "current", "foreign", "older", "other-lease", "never-existed"]
#: Releases a task may have before the next one fails it (small, so the bound is reached).
MAX_RELEASES = 1


@dataclass
class Task:
    """One task as the store would hold it."""

    task_id: uuid.UUID
    seq: int
    priority: int
    max_attempts: int
    ttl: int
    selector: Selector
    status: TaskStatus = TaskStatus.QUEUED
    attempts: list[AttemptRecord] = field(default_factory=list)
    end_reasons: dict[int, EndReason] = field(default_factory=dict)
    cancel_requests: set[int] = field(default_factory=set)
    reason: TaskReason | None = None
    releases: int = 0

    @property
    def current(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    def record(self) -> TaskRecord:
        cur = self.current
        return TaskRecord(
            task_id=self.task_id,
            status=self.status,
            attempt_count=len(self.attempts),
            max_attempts=self.max_attempts,
            lease_ttl_s=self.ttl,
            current=cur,
            cancel_requested=cur is not None and cur.attempt in self.cancel_requests,
            releases=self.releases,
        )

    def set_current(self, **changes: object) -> None:
        self.attempts[-1] = replace(self.attempts[-1], **changes)  # type: ignore[arg-type]

    def snapshot(self) -> tuple[object, ...]:
        return (
            self.status,
            tuple(self.attempts),
            tuple(sorted(self.end_reasons.items())),
            frozenset(self.cancel_requests),
            self.reason,
            self.releases,
        )


@dataclass(frozen=True)
class Accepted:
    """An accepted claim, renew or report, with the state it was accepted against."""

    op: str
    ref: LeaseRef
    status: TaskStatus
    current: AttemptRecord | None
    now_before_expiry: bool


class Scheduler(RuleBasedStateMachine):
    """Submit, assign, claim, renew, report, cancel, let time pass and sweep, all through core."""

    @initialize()
    def start(self) -> None:
        self.now = T0
        self.tasks: list[Task] = []
        self.reserved: dict[str, tuple[uuid.UUID, int]] = {}
        self.accepted: list[Accepted] = []
        self.checked = 0
        self.terminal_snapshots: dict[uuid.UUID, tuple[object, ...]] = {}

    # --- helpers ------------------------------------------------------------------------------

    def pick(self, i: int) -> Task | None:
        # Rules pick a task by index rather than by precondition, so no draw is ever filtered away.
        return self.tasks[i % len(self.tasks)] if self.tasks else None

    def named_ref(self, t: Task, how: str, j: int) -> tuple[AttemptRecord | None, LeaseRef, bool]:
        """The attempt a host names, its ref, and whether that ref is the true current lease."""
        cur = t.current
        assert cur is not None
        n = cur.attempt
        if how == "never-existed":
            return None, LeaseRef(HOSTS[j % 2], t.task_id, n + 1 + j % 3, uuid.uuid4()), False
        named = t.attempts[j % (n - 1)] if how == "older" and n > 1 else cur
        ref = LeaseRef(named.host_id, t.task_id, named.attempt, named.lease_id)
        if how == "foreign":
            ref = replace(ref, host_id=next(h for h in HOSTS if h != named.host_id))
        elif how == "other-lease":
            ref = replace(ref, lease_id=uuid.uuid4())
        return named, ref, ref.attempt == n and ref.lease_id == cur.lease_id and ref.host_id == cur.host_id

    def live(self, t: Task) -> bool:
        cur = t.current
        return (
            t.status in IN_FLIGHT
            and cur is not None
            and cur.status is AttemptStatus.ACTIVE
            and self.now < cur.expires_at
        )

    def log(self, op: str, t: Task, ref: LeaseRef) -> None:
        cur = t.current
        self.accepted.append(Accepted(op, ref, t.status, cur, cur is not None and self.now < cur.expires_at))

    def release(self, t: Task) -> None:
        cur = t.current
        assert cur is not None
        assert self.reserved.pop(cur.device_id) == (t.task_id, cur.attempt)

    # --- rules --------------------------------------------------------------------------------

    @rule(
        priority=st.integers(-1, 1),
        max_attempts=st.integers(1, 3),
        ttl=st.integers(1, 4),
        selector=st.sampled_from(SELECTORS),
    )
    def submit(self, priority: int, max_attempts: int, ttl: int, selector: Selector) -> None:
        if len(self.tasks) >= 6:
            return
        status = next_status(None, Trigger.SUBMIT)
        self.tasks.append(Task(new_task_id(), len(self.tasks), priority, max_attempts, ttl, selector, status=status))

    @rule()
    def assign(self) -> None:
        queued = sorted((t for t in self.tasks if t.status is TaskStatus.QUEUED), key=lambda t: (-t.priority, t.seq))
        by_id = {t.task_id: t for t in queued}
        free = [d for d in DEVICES if d.device_id not in self.reserved]
        plan = plan_assignments([QueuedTask(t.task_id, t.selector) for t in queued], free)
        for q, device in plan:
            assert matches(q.selector, device)
            t = by_id[q.task_id]
            t.status = next_status(t.status, Trigger.ASSIGN)
            n = len(t.attempts) + 1
            t.attempts.append(
                AttemptRecord(
                    attempt=n,
                    lease_id=new_lease_id(),
                    host_id=device.host_id,
                    device_id=device.device_id,
                    status=AttemptStatus.ACTIVE,
                    expires_at=self.now + timedelta(seconds=t.ttl),
                )
            )
            assert device.device_id not in self.reserved
            self.reserved[device.device_id] = (t.task_id, n)
        # a queued task left over could use no free device
        planned = {q.task_id for q, _ in plan}
        taken = {d.device_id for _, d in plan}
        for t in queued:
            if t.task_id not in planned:
                assert not [d for d in free if d.device_id not in taken and matches(t.selector, d)]

    @rule(i=st.integers(0, 100), how=st.sampled_from(REFS), j=st.integers(0, 100), renew=st.booleans())
    def claim_or_renew(self, i: int, how: str, j: int, renew: bool) -> None:
        t = self.pick(i)
        if t is None or not t.attempts:
            return
        named, ref, is_current = self.named_ref(t, how, j)
        live = self.live(t)
        decide = decide_renew if renew else decide_claim
        try:
            ext = decide(t.record(), named, ref, self.now)
        except Conflict as exc:
            event(f"{'renew' if renew else 'claim'}: {exc.code}")
            assert not (is_current and live), "the live current lease was refused"
            return
        assert is_current, f"{how} ref accepted"
        event(f"{'renew' if renew else 'claim'}: accepted{' (dispatch)' if ext.dispatch else ''}")
        self.log("renew" if renew else "claim", t, ref)
        assert ext.ttl_s == t.ttl
        assert t.current is not None
        assert ext.cancel_requested == (t.current.attempt in t.cancel_requests)
        if ext.dispatch:
            assert not renew
            t.status = next_status(t.status, Trigger.CLAIM)
            t.set_current(dispatched=True)
        else:
            assert renew or t.status is TaskStatus.DISPATCHED
        t.set_current(expires_at=ext.expires_at)

    @rule(i=st.integers(0, 100), how=st.sampled_from(REFS), j=st.integers(0, 100), outcome=st.sampled_from(Outcome))
    def report(self, i: int, how: str, j: int, outcome: Outcome) -> None:
        t = self.pick(i)
        if t is None or not t.attempts:
            return
        named, ref, is_current = self.named_ref(t, how, j)
        requested = named is not None and named.attempt in t.cancel_requests
        before = t.snapshot()
        try:
            decision = decide_report(t.record(), named, ref, outcome, self.now, cancel_requested_for_attempt=requested)
        except Conflict as exc:
            event(f"report: {exc.code}")
            ok = self.live(t) and (outcome is not Outcome.CANCELLED or requested)
            assert not (is_current and ok), "the live current lease's report was refused"
            return
        assert is_current, f"{how} ref accepted"
        cur = t.current
        assert cur is not None
        event(f"report: {decision.kind} {outcome}")
        if decision.kind is ReportKind.DUPLICATE:
            assert t.end_reasons.get(cur.attempt) == EndReason(outcome.value)
            assert t.snapshot() == before
            return
        self.log("report", t, ref)
        assert decision.task_status is outcome.task_status
        t.status = decision.task_status
        t.set_current(status=decision.attempt_status)
        t.end_reasons[cur.attempt] = EndReason(outcome.value)
        self.release(t)

    @rule(i=st.integers(0, 100), how=st.sampled_from(REFS), j=st.integers(0, 100))
    def give_back(self, i: int, how: str, j: int) -> None:
        t = self.pick(i)
        if t is None or not t.attempts:
            return
        named, ref, is_current = self.named_ref(t, how, j)
        before = t.snapshot()
        try:
            decision = decide_release(t.record(), named, ref, self.now, max_releases=MAX_RELEASES)
        except Conflict as exc:
            event(f"release: {exc.code}")
            assert not (is_current and self.live(t)), "the live current lease's release was refused"
            return
        event(f"release: {decision.kind} {decision.task_status}")
        if decision.kind is ReportKind.DUPLICATE:
            # the same lease released this attempt before, current or not any more
            assert named is not None
            assert named.status is AttemptStatus.RELEASED
            assert (named.host_id, named.lease_id) == (ref.host_id, ref.lease_id)
            assert decision.task_status is t.status
            assert t.snapshot() == before
            return
        assert is_current, f"{how} ref accepted"
        self.log("release", t, ref)
        cur = t.current
        assert cur is not None
        assert decision.trigger is not None
        assert decision.task_status is next_status(t.status, decision.trigger)
        t.status = decision.task_status
        t.reason = decision.reason
        t.releases += 1
        t.set_current(status=AttemptStatus.RELEASED)
        t.end_reasons[cur.attempt] = EndReason.RELEASED
        self.release(t)

    @rule(i=st.integers(0, 100))
    def cancel(self, i: int) -> None:
        t = self.pick(i)
        if t is None:
            return
        before = t.snapshot()
        kind = decide_cancel(t.record())
        event(f"cancel: {kind}")
        if kind is CancelKind.CANCEL_NOW:
            assert t.status is TaskStatus.QUEUED
            t.status = next_status(t.status, Trigger.CANCEL)
            t.reason = TaskReason.CANCELLED_WHILE_QUEUED
        elif kind is CancelKind.RECORD_REQUEST:
            assert t.status in IN_FLIGHT
            assert t.current is not None
            assert t.current.attempt not in t.cancel_requests
            t.cancel_requests.add(t.current.attempt)
        elif kind is CancelKind.ALREADY_REQUESTED:
            assert t.current is not None
            assert t.current.attempt in t.cancel_requests
            assert t.snapshot() == before
        else:
            assert kind is CancelKind.TERMINAL
            assert t.status in TERMINAL

    @rule(seconds=st.sampled_from([0.25, 1, 2, 5]))
    def advance_clock(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def sweep(self) -> None:
        for t in self.tasks:
            record = t.record()
            if not is_expired(record, self.now):
                continue
            decision = decide_expiry(record)
            event(f"sweep: {decision.trigger}")
            cur = t.current
            assert cur is not None
            t.status = decision.task_status
            t.reason = decision.reason
            t.set_current(status=AttemptStatus.EXPIRED)
            t.end_reasons[cur.attempt] = EndReason.LEASE_EXPIRED
            self.release(t)

    # --- invariants ---------------------------------------------------------------------------

    def active(self) -> list[tuple[Task, AttemptRecord]]:
        return [(t, a) for t in self.tasks for a in t.attempts if a.status is AttemptStatus.ACTIVE]

    @invariant()
    def device_has_at_most_one_active_attempt(self) -> None:
        devices = [a.device_id for _, a in self.active()]
        assert len(devices) == len(set(devices))
        # and a reservation is held exactly while its attempt is active (invariant 3)
        assert self.reserved == {a.device_id: (t.task_id, a.attempt) for t, a in self.active()}

    @invariant()
    def task_has_one_active_attempt_and_no_gaps(self) -> None:
        for t in self.tasks:
            assert [a.attempt for a in t.attempts] == list(range(1, len(t.attempts) + 1))
            active = [a for a in t.attempts if a.status is AttemptStatus.ACTIVE]
            assert len(active) <= 1
            # only the newest attempt may be active, exactly while the task is in flight
            assert (t.status in IN_FLIGHT) == bool(active)
            assert not active or active[0] is t.current

    @invariant()
    def only_the_current_live_lease_is_accepted(self) -> None:
        for entry in self.accepted[self.checked :]:
            cur = entry.current
            assert cur is not None
            assert (entry.ref.host_id, entry.ref.attempt, entry.ref.lease_id) == (
                cur.host_id,
                cur.attempt,
                cur.lease_id,
            )
            assert cur.status is AttemptStatus.ACTIVE
            assert entry.now_before_expiry
            assert entry.status in IN_FLIGHT
        self.checked = len(self.accepted)

    @invariant()
    def attempt_count_within_max_attempts(self) -> None:
        for t in self.tasks:
            # released attempts do not count, and releases themselves are bounded
            released = [a for a in t.attempts if a.status is AttemptStatus.RELEASED]
            assert t.releases == len(released) <= MAX_RELEASES + 1
            assert len(t.attempts) <= t.max_attempts + t.releases

    @invariant()
    def ended_attempts_keep_their_end_reason(self) -> None:
        by_status = {
            AttemptStatus.EXPIRED: EndReason.LEASE_EXPIRED,
            AttemptStatus.DONE: EndReason.DONE,
            AttemptStatus.FAILED: EndReason.FAILED,
            AttemptStatus.CANCELLED: EndReason.CANCELLED,
            AttemptStatus.RELEASED: EndReason.RELEASED,
        }
        for t in self.tasks:
            for a in t.attempts:
                if a.status is AttemptStatus.ACTIVE:
                    assert a.attempt not in t.end_reasons
                else:
                    assert t.end_reasons[a.attempt] is by_status[a.status]

    @invariant()
    def terminal_tasks_never_change(self) -> None:
        for t in self.tasks:
            if t.task_id in self.terminal_snapshots:
                assert t.snapshot() == self.terminal_snapshots[t.task_id]
            elif t.status in TERMINAL:
                self.terminal_snapshots[t.task_id] = t.snapshot()

    @invariant()
    def task_reasons_follow_how_the_task_ended(self) -> None:
        for t in self.tasks:
            last = t.current
            if t.reason is TaskReason.LEASE_EXPIRED:
                assert t.status is TaskStatus.FAILED
                assert last is not None
                assert last.status is AttemptStatus.EXPIRED
                assert len(t.attempts) - t.releases == t.max_attempts
            elif t.reason is TaskReason.CANCELLED_AFTER_RELEASE:
                assert t.status is TaskStatus.CANCELLED
                assert last is not None
                assert last.status is AttemptStatus.RELEASED
                assert last.attempt in t.cancel_requests
            elif t.reason is TaskReason.RELEASED_TOO_OFTEN:
                assert t.status is TaskStatus.FAILED
                assert last is not None
                assert last.status is AttemptStatus.RELEASED
                assert t.releases == MAX_RELEASES + 1
            elif t.reason is TaskReason.CANCELLED_AFTER_LEASE_EXPIRED:
                assert t.status is TaskStatus.CANCELLED
                assert last is not None
                assert last.status is AttemptStatus.EXPIRED
                assert last.attempt in t.cancel_requests
            elif t.reason is TaskReason.CANCELLED_WHILE_QUEUED:
                assert t.status is TaskStatus.CANCELLED
                assert last is None or last.status in (AttemptStatus.EXPIRED, AttemptStatus.RELEASED)
            elif t.status in TERMINAL:
                # ended by its host's report
                assert last is not None
                assert last.status.value == t.status.value
            if last is not None and last.status is AttemptStatus.CANCELLED:
                # a cancelled report needs a request against that attempt
                assert last.attempt in t.cancel_requests


Scheduler.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestScheduler = Scheduler.TestCase
