from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.backoff import MAX_RETRY_AFTER_S, backoff_delay, backoff_delays, retry_after
from devsched.core.errors import TooManyRequests, Unavailable

pytestmark = pytest.mark.unit


@given(
    failures=st.integers(min_value=1, max_value=10_000),
    base=st.floats(min_value=0.001, max_value=10),
    extra=st.floats(min_value=0, max_value=100),
    jitter=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_delays_stay_within_the_jittered_capped_ceiling(
    failures: int, base: float, extra: float, jitter: float
) -> None:
    cap = base + extra
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 64))
    delay = backoff_delay(failures, base_s=base, cap_s=cap, random_fraction=lambda: jitter)
    assert ceiling / 2 <= delay <= ceiling <= cap


def test_the_ceiling_doubles_up_to_the_cap() -> None:
    top = [backoff_delay(n, base_s=0.5, cap_s=3.0, random_fraction=lambda: 1.0) for n in range(1, 6)]
    assert top == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_the_series_is_endless_and_bounded() -> None:
    delays = list(itertools.islice(backoff_delays(base_s=0.1, cap_s=1.0), 200))
    assert len(delays) == 200
    assert all(0.05 <= d <= 1.0 for d in delays)


@pytest.mark.parametrize(("failures", "base", "cap"), [(0, 1.0, 2.0), (1, 0.0, 2.0), (1, 3.0, 2.0)])
def test_nonsense_inputs_are_refused(failures: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError, match=r"must be|need"):
        backoff_delay(failures, base_s=base, cap_s=cap)


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ({"retry_after_s": 0.25}, 0.25),
        ({"retry_after_s": 2}, 2.0),
        ({"retry_after_s": 3600}, MAX_RETRY_AFTER_S),  # a scheduler asking for more is capped
        ({"retry_after_s": -1}, 0.0),
        ({"retry_after_s": float("nan")}, 0.0),
        ({"retry_after_s": True}, 0.0),
        ({"retry_after_s": "1"}, 0.0),
        ({}, 0.0),
    ],
)
def test_a_429_asks_for_its_pause(details: dict[str, object], expected: float) -> None:
    err = TooManyRequests()
    err.details = dict(details)
    assert retry_after(err) == expected


def test_other_errors_ask_for_no_pause() -> None:
    assert retry_after(Unavailable()) == 0.0
    assert retry_after(TimeoutError()) == 0.0
