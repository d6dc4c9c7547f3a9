"""Core's device-health rule: what counts as an infrastructure failure, and when a device is quarantined."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.health import (
    DeviceOutcome,
    is_device_fault,
    outcome_of,
    tally,
)
from devsched.core.retrying import RetryCause


@pytest.mark.parametrize(
    ("cause", "done", "expected"),
    [
        (None, True, DeviceOutcome.HEALTHY),
        (RetryCause.INFRA, False, DeviceOutcome.INFRA_FAILURE),
        (RetryCause.LEASE_EXPIRED, False, DeviceOutcome.INFRA_FAILURE),
        (RetryCause.STEP_FAILED, False, DeviceOutcome.NEUTRAL),
        (RetryCause.ATTEMPT_TIMEOUT, False, DeviceOutcome.NEUTRAL),
        (RetryCause.RELEASED, False, DeviceOutcome.NEUTRAL),  # an agent shutdown is nobody's fault
        (None, False, DeviceOutcome.NEUTRAL),
    ],
)
def test_outcome_of(cause: RetryCause | None, done: bool, expected: DeviceOutcome) -> None:
    assert outcome_of(cause, done=done) is expected


@pytest.mark.parametrize(
    ("reason", "fault"),
    [
        ("device_fault", True),
        ("device_fault: adb device vanished", True),
        (" device_fault; teardown failed", True),
        ("shutdown", False),
        ("device_faulty", False),
        (None, False),
        ("", False),
    ],
)
def test_is_device_fault(reason: str | None, fault: bool) -> None:
    assert is_device_fault(reason) is fault


def test_the_third_consecutive_failure_quarantines_once() -> None:
    count, quarantined = 0, False
    crossings = []
    for _ in range(5):
        t = tally(count, DeviceOutcome.INFRA_FAILURE, 3, quarantined=quarantined)
        count, quarantined = t.infra_failures, quarantined or t.quarantine
        crossings.append(t.quarantine)
    assert crossings == [False, False, True, False, False]
    assert count == 5


def test_a_success_resets_and_a_neutral_outcome_keeps_the_count() -> None:
    assert tally(2, DeviceOutcome.HEALTHY, 3) == tally(0, DeviceOutcome.HEALTHY, 3)
    assert tally(2, DeviceOutcome.HEALTHY, 3).infra_failures == 0
    assert tally(2, DeviceOutcome.NEUTRAL, 3).infra_failures == 2


def test_threshold_zero_never_quarantines_and_negatives_are_refused() -> None:
    assert not tally(99, DeviceOutcome.INFRA_FAILURE, 0).quarantine
    with pytest.raises(ValueError, match="non-negative"):
        tally(-1, DeviceOutcome.INFRA_FAILURE, 3)


@given(
    outcomes=st.lists(st.sampled_from(list(DeviceOutcome)), max_size=30),
    threshold=st.integers(min_value=0, max_value=5),
)
def test_quarantined_exactly_when_a_run_of_failures_reaches_the_threshold(
    outcomes: list[DeviceOutcome], threshold: int
) -> None:
    count, quarantined, run, reached = 0, False, 0, False
    for outcome in outcomes:
        t = tally(count, outcome, threshold, quarantined=quarantined)
        count, quarantined = t.infra_failures, quarantined or t.quarantine
        run = 0 if outcome is DeviceOutcome.HEALTHY else run + (outcome is DeviceOutcome.INFRA_FAILURE)
        reached = reached or (threshold > 0 and run >= threshold)
        assert count == run
    assert quarantined == reached
