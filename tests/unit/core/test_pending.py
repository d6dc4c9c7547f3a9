"""Why a queued task waits (`devsched.core.pending`): each code from its counts, and properties of the rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.pending import Matches, PendingCode, Waiting, pending_reason

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)


def code(reason: str) -> str:
    return reason.partition(": ")[0]


@pytest.mark.parametrize(
    ("task", "devices", "expected"),
    [
        (Waiting(1, not_before=LATER), Matches(matching=1, online=1, ready=1), PendingCode.RETRY_BACKOFF),
        (Waiting(1, not_before=NOW), Matches(matching=1, online=1, ready=1), PendingCode.AWAITING_ASSIGNMENT),
        (Waiting(0), Matches(), PendingCode.NO_MATCHING_DEVICE),
        (Waiting(0, actions=("adb",)), Matches(without_actions=2), PendingCode.NO_HOST_WITH_ACTION),
        (Waiting(0), Matches(without_actions=2), PendingCode.NO_MATCHING_DEVICE),
        (Waiting(0), Matches(matching=2), PendingCode.NO_ONLINE_DEVICE),
        (Waiting(0), Matches(matching=2, online=2, drained=2), PendingCode.DEVICES_DRAINED),
        (Waiting(0), Matches(matching=2, online=2, quarantined=2), PendingCode.DEVICES_QUARANTINED),
        (Waiting(0), Matches(matching=2, online=2, drained=1, quarantined=1), PendingCode.DEVICES_QUARANTINED),
        (Waiting(0), Matches(matching=3, online=2, quarantined=1, busy=1), PendingCode.DEVICES_BUSY),
        (Waiting(0), Matches(matching=1, online=1, grace_until=LATER), PendingCode.DEVICE_GRACE),
        (Waiting(0), Matches(matching=2, online=2, quarantined=1, ready=1), PendingCode.AWAITING_ASSIGNMENT),
    ],
)
def test_each_code_from_its_counts(task: Waiting, devices: Matches, expected: PendingCode) -> None:
    assert code(pending_reason(task, devices, NOW)) == expected


def test_the_explanations_name_what_the_operator_acts_on() -> None:
    backoff = pending_reason(Waiting(2, not_before=LATER), Matches(), NOW)
    assert backoff == f"retry_backoff: attempt 2 ended and the retry policy waits until {LATER.isoformat()}"
    quarantined = pending_reason(Waiting(0), Matches(matching=3, online=3, drained=1, quarantined=2), NOW)
    assert quarantined == (
        "devices_quarantined: every online device matching the selector is out of service "
        "(2 quarantined after repeated infrastructure failures, 1 drained)"
    )
    actions = pending_reason(Waiting(0, actions=("adb", "flash")), Matches(without_actions=1), NOW)
    assert actions == "no_host_with_action: no host with a matching device offers adb, flash"
    busy = pending_reason(Waiting(0), Matches(matching=4, online=3, quarantined=1, busy=2), NOW)
    assert busy == "devices_busy: all 2 matching devices are running other tasks"
    grace = pending_reason(Waiting(0), Matches(matching=1, online=1, grace_until=LATER), NOW)
    assert grace == f"device_grace: matching devices are in their post-expiry grace until {LATER.isoformat()}"


@st.composite
def consistent(draw: st.DrawFn) -> Matches:
    """Counts a database could give: each a subset of the one before it."""
    matching = draw(st.integers(0, 6))
    online = draw(st.integers(0, matching))
    drained = draw(st.integers(0, online))
    quarantined = draw(st.integers(0, online - drained))
    busy = draw(st.integers(0, online - drained - quarantined))
    idle = online - drained - quarantined - busy
    ready = draw(st.integers(0, idle))
    grace = None if ready == idle else LATER
    return Matches(matching, online, drained, quarantined, busy, ready, grace, draw(st.integers(matching, 8)))


waiting = st.builds(
    Waiting,
    st.integers(0, 5),
    st.one_of(st.none(), st.sampled_from([NOW - timedelta(seconds=1), NOW, LATER])),
    st.sampled_from([(), ("adb",)]),
)


@given(waiting, consistent())
def test_the_rule_is_total_and_says_free_only_when_a_device_could_take_the_task(task: Waiting, m: Matches) -> None:
    reason = pending_reason(task, m, NOW)
    assert code(reason) in {c.value for c in PendingCode}
    assert reason.partition(": ")[2]  # an explanation follows the code
    backing_off = task.not_before is not None and task.not_before > NOW
    assert (code(reason) == PendingCode.RETRY_BACKOFF) == backing_off
    if not backing_off:
        assert (code(reason) == PendingCode.AWAITING_ASSIGNMENT) == (m.ready > 0)
        # a quarantined match is never reported as free, nor its pool as merely drained
        if m.online and m.in_service == 0:
            expected = PendingCode.DEVICES_QUARANTINED if m.quarantined else PendingCode.DEVICES_DRAINED
            assert code(reason) == expected
