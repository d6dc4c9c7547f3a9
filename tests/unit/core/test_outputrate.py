"""A host's output rate share: what it wrote, read from its logs stream's state, against its share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.outputrate import OutputShare, RateWindow, Reading, Written, written

pytestmark = pytest.mark.unit

SHARE = OutputShare(records_per_s=10.0, bytes_per_s=1000.0, window_s=2.0, cooldown_s=3.0)


def reading(at: float, last_seq: int, messages: int | None = None, size: int | None = None) -> Reading:
    held = last_seq if messages is None else messages
    return Reading(at=at, last_seq=last_seq, messages=held, bytes=held * 10 if size is None else size)


def test_records_are_the_growth_of_the_last_sequence_and_bytes_the_growth_of_the_size() -> None:
    assert written(reading(0, 5), reading(1, 8)) == Written(records=3, bytes=30)


def test_records_the_stream_dropped_meanwhile_count_at_its_mean_size() -> None:
    # at its byte share: 100 records of 10 bytes held; 50 more written, 50 of the oldest dropped
    before = reading(0, 100, messages=100, size=1000)
    after = reading(1, 150, messages=100, size=1000)
    assert written(before, after) == Written(records=50, bytes=500)


def test_a_stream_made_anew_does_not_compare() -> None:
    assert written(reading(0, 100), reading(1, 3)) is None


def test_a_burst_within_the_window_is_fine_and_one_past_it_is_not() -> None:
    window = RateWindow(SHARE)
    assert window.add(reading(0.0, 0)) is None
    assert window.add(reading(0.5, 20)) is None, "20 records in a 2 s window of 10/s: the whole budget, at once"
    over = window.add(reading(1.0, 21))
    assert over == Written(records=21, bytes=210)


def test_the_bytes_bound_holds_on_its_own() -> None:
    window = RateWindow(SHARE)
    window.add(reading(0.0, 0, size=0))
    assert window.add(reading(1.0, 2, size=2000)) is None
    assert window.add(reading(1.5, 3, size=2001)) == Written(records=3, bytes=2001)


def test_what_left_the_window_is_not_counted() -> None:
    window = RateWindow(SHARE)
    at, seq = 0.0, 0
    for _ in range(100):  # 9 records a second, steadily, for 25 s: under 10/s, never over
        assert window.add(reading(at, seq, messages=1, size=10)) is None
        at, seq = at + 0.25, seq + 2
    assert window.add(reading(at, seq + 30, messages=1, size=10)) is not None, "then a burst of 30"


def test_a_cleared_window_forgets_the_flood_that_closed_the_stream() -> None:
    window = RateWindow(SHARE)
    window.add(reading(0.0, 0))
    assert window.add(reading(1.0, 1000)) is not None
    window.clear()
    assert window.add(reading(4.0, 1000)) is None
    assert window.add(reading(4.5, 1005)) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"records_per_s": 0.0},
        {"bytes_per_s": -1.0},
        {"window_s": float("inf")},
        {"cooldown_s": float("nan")},
        {"cooldown_s": 1.0},  # shorter than the window
    ],
)
def test_bad_shares_are_refused(fields: dict[str, float]) -> None:
    base = {"records_per_s": 10.0, "bytes_per_s": 1000.0, "window_s": 2.0, "cooldown_s": 3.0}
    with pytest.raises(ValueError, match=next(iter(fields)) if "cooldown" not in fields else "cooldown_s"):
        OutputShare(**(base | fields))


@given(st.lists(st.tuples(st.floats(0.01, 1.0), st.integers(0, 30)), min_size=1, max_size=60))
def test_a_host_is_over_exactly_when_the_window_holds_more_than_its_share(steps: list[tuple[float, int]]) -> None:
    """Against a brute-force count: the records stored at readings within the window (`written` is exact
    for records), compared with the budget."""
    window = RateWindow(SHARE)
    at, seq = 0.0, 0
    history = [(at, seq)]
    window.add(reading(at, seq, messages=1, size=10))
    for gap, records in steps:
        at, seq = at + gap, seq + records
        history.append((at, seq))
        over = window.add(reading(at, seq, messages=1, size=10))
        first = next(s for t, s in history if t >= at - SHARE.window_s)
        assert (over is not None) == (seq - first > SHARE.max_records or 10 * (seq - first) > SHARE.max_bytes)
