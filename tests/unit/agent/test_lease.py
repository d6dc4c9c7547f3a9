from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.agent.lease import RENEW_FRACTION, LeaseClock, schedule

pytestmark = pytest.mark.unit

times = st.floats(min_value=0, max_value=1e9, allow_nan=False)
ttls = st.floats(min_value=1e-3, max_value=3600, allow_nan=False)
margins = st.floats(min_value=0, max_value=10, allow_nan=False)
fractions = st.floats(min_value=0.05, max_value=0.95)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_deadline_is_ttl_after_the_request_was_sent() -> None:
    assert schedule(100.0, 30.0) == schedule(100.0, 30.0, fraction=RENEW_FRACTION)
    planned = schedule(100.0, 30.0)
    assert planned.deadline == 130.0
    assert planned.next_renewal == pytest.approx(110.0)


@given(sent_at=times, ttl=ttls, margin=margins, fraction=fractions)
def test_renewal_falls_between_the_request_and_the_deadline(
    sent_at: float, ttl: float, margin: float, fraction: float
) -> None:
    planned = schedule(sent_at, ttl, fraction=fraction, margin_s=margin)
    assert planned.deadline <= sent_at + ttl
    assert sent_at <= planned.next_renewal <= planned.deadline
    if ttl - margin >= 1e-3 and sent_at <= 1e6:  # a representable gap: the renewal comes strictly first
        assert planned.next_renewal < planned.deadline


@given(grants=st.lists(st.tuples(times, ttls), min_size=1, max_size=20))
def test_the_deadline_only_moves_forward_and_comes_from_a_grant(grants: list[tuple[float, float]]) -> None:
    clock = LeaseClock(clock=FakeClock())
    deadlines = []
    for sent_at, ttl in grants:
        clock.grant(sent_at, ttl)
        assert clock.deadline is not None
        deadlines.append(clock.deadline)
    assert deadlines == sorted(deadlines)
    assert clock.deadline == max(sent_at + ttl for sent_at, ttl in grants)


@pytest.mark.parametrize(("ttl", "fraction"), [(0.0, 0.3), (-1.0, 0.3), (10.0, 0.0), (10.0, 1.0)])
def test_nonsense_inputs_are_refused(ttl: float, fraction: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        schedule(0.0, ttl, fraction=fraction)


def test_a_lease_never_granted_is_not_live() -> None:
    clock = LeaseClock(clock=FakeClock())
    assert not clock.live()
    assert clock.deadline is None
    assert clock.next_renewal is None
    assert clock.remaining() == 0.0
    assert clock.until_renewal() == 0.0


def test_the_lease_is_live_until_the_deadline_on_the_injected_clock() -> None:
    now = FakeClock(100.0)
    clock = LeaseClock(clock=now)
    clock.grant(sent_at=99.0, ttl_s=30.0)
    assert clock.ttl_s == 30.0
    assert clock.live()
    assert clock.remaining() == pytest.approx(29.0)
    assert clock.until_renewal() == pytest.approx(9.0)
    now.now = 109.0
    assert clock.until_renewal() == 0.0
    assert clock.live()
    now.now = 128.999
    assert clock.live()
    now.now = 129.0
    assert not clock.live()
    assert clock.remaining() == 0.0


def test_a_late_reply_to_an_older_request_does_not_shorten_the_lease() -> None:
    clock = LeaseClock(clock=FakeClock())
    clock.grant(sent_at=110.0, ttl_s=30.0)
    clock.grant(sent_at=100.0, ttl_s=30.0)
    assert clock.deadline == 140.0


def test_a_margin_gives_up_earlier() -> None:
    clock = LeaseClock(clock=FakeClock(), margin_s=2.0)
    clock.grant(sent_at=100.0, ttl_s=30.0)
    assert clock.deadline == 128.0
