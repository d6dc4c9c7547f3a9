"""Fair share per host: the in-flight bound, the token bucket, and refusals that change nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsched.core.fairshare import MIN_RETRY_AFTER_S, PerDevice, Share, ShareLimits, admit, release, scaled

pytestmark = pytest.mark.unit

LIMITS = ShareLimits(max_in_flight=2, rate_per_s=10.0, burst=5)


def test_a_new_host_gets_its_burst_then_waits_for_tokens() -> None:
    share: Share | None = None
    for _ in range(LIMITS.burst):
        decision = admit(share, LIMITS, now=0.0)
        assert decision.admitted
        share = release(decision.share)
    refused = admit(share, LIMITS, now=0.0)
    assert not refused.admitted
    assert refused.retry_after_s == pytest.approx(1 / LIMITS.rate_per_s)
    # after the suggested pause, one more token is there
    assert admit(refused.share, LIMITS, now=refused.retry_after_s).admitted


def test_the_in_flight_bound_refuses_until_a_request_finishes() -> None:
    first = admit(None, LIMITS, 0.0)
    second = admit(first.share, LIMITS, 0.0)
    third = admit(second.share, LIMITS, 0.0)
    assert first.admitted
    assert second.admitted
    assert not third.admitted
    assert third.retry_after_s is not None
    assert third.retry_after_s >= MIN_RETRY_AFTER_S
    assert third.share.in_flight == 2
    assert admit(release(third.share), LIMITS, 0.0).admitted


def test_a_refusal_takes_no_token_and_no_slot() -> None:
    share = Share(tokens=0.5, at=0.0, in_flight=1)
    decision = admit(share, LIMITS, 0.0)
    assert not decision.admitted
    assert decision.share == share
    assert decision.retry_after_s == pytest.approx(0.05)


def test_tokens_never_exceed_the_burst_and_a_clock_going_back_refills_nothing() -> None:
    share = Share(tokens=1.0, at=10.0)
    assert share.refilled(LIMITS, 1000.0).tokens == LIMITS.burst
    assert share.refilled(LIMITS, 5.0) == Share(tokens=1.0, at=10.0)


def test_idle_shares_are_exactly_the_forgettable_ones() -> None:
    assert Share.full(LIMITS, 0.0).idle(LIMITS, 0.0)
    assert not Share(tokens=5.0, at=0.0, in_flight=1).idle(LIMITS, 0.0)
    assert not Share(tokens=0.0, at=0.0).idle(LIMITS, 0.1)
    assert Share(tokens=0.0, at=0.0).idle(LIMITS, 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_in_flight": 0, "rate_per_s": 1.0, "burst": 1},
        {"max_in_flight": 1, "rate_per_s": 0.0, "burst": 1},
        {"max_in_flight": 1, "rate_per_s": float("inf"), "burst": 1},
        {"max_in_flight": 1, "rate_per_s": 1.0, "burst": 0},
    ],
)
def test_limits_must_be_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ShareLimits(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(min_value=0, max_value=0.5), st.booleans()), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=4),
    st.floats(min_value=0.5, max_value=50),
    st.integers(min_value=1, max_value=20),
)
def test_admitted_requests_stay_within_burst_plus_rate_and_the_in_flight_bound(
    steps: list[tuple[float, bool]], max_in_flight: int, rate: float, burst: int
) -> None:
    limits = ShareLimits(max_in_flight=max_in_flight, rate_per_s=rate, burst=burst)
    share: Share | None = None
    now = 0.0
    admitted = 0
    for gap, finish_one in steps:
        now += gap
        if finish_one and share is not None:
            share = release(share)
        decision = admit(share, limits, now)
        share = decision.share
        assert share.in_flight <= max_in_flight
        assert 0 <= share.tokens <= burst
        if decision.admitted:
            admitted += 1
        else:
            assert decision.retry_after_s is not None
            assert decision.retry_after_s > 0
        # never more than the bucket plus what the rate refilled since the first request
        assert admitted <= burst + rate * now + 1e-6


def test_each_device_adds_its_part_to_the_hosts_share() -> None:
    base = ShareLimits(max_in_flight=16, rate_per_s=200.0, burst=400)
    per_device = PerDevice(in_flight=2, rate_per_s=20.0, burst=40)
    assert scaled(base, per_device, 0) == base
    assert scaled(base, per_device, -3) == base
    assert scaled(base, per_device, 16) == ShareLimits(max_in_flight=48, rate_per_s=520.0, burst=1040)
    assert scaled(base, PerDevice(), 100) == base


@pytest.mark.parametrize(
    "kwargs", [{"in_flight": -1}, {"burst": -1}, {"rate_per_s": -0.5}, {"rate_per_s": float("inf")}]
)
def test_what_a_device_adds_cannot_be_negative_or_infinite(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="device"):
        PerDevice(**kwargs)  # type: ignore[arg-type]
