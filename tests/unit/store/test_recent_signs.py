"""`RecentSigns`: which lease requests may leave the host's sign of life out, by the store's clock."""

from __future__ import annotations

import asyncio

import pytest

from devsched.store import ManualClock
from devsched.store.liveness import RECENT_S, RecentSigns

pytestmark = pytest.mark.unit


def _touches(signs: RecentSigns, host_id: str) -> bool:
    """Whether a statement of `host_id` begun now carries the sign of life (and it commits)."""
    with signs.signing(host_id) as touch:
        return touch


def test_a_host_is_recent_for_recent_s_from_when_its_touching_statement_began() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    assert _touches(signs, "h1")
    clock.advance(RECENT_S * 0.6)
    assert not _touches(signs, "h1")
    assert _touches(signs, "h2"), "each host on its own"
    clock.advance(RECENT_S * 0.39)
    assert not _touches(signs, "h1"), "a statement that left it out does not move the window"
    clock.advance(RECENT_S * 0.01)
    assert _touches(signs, "h1"), "RECENT_S after the touching statement began"


def test_requests_that_arrive_while_the_touching_statement_runs_leave_it_out() -> None:
    signs = RecentSigns(ManualClock())
    with signs.signing("h1") as first:
        assert first
        assert [_touches(signs, "h1") for _ in range(3)] == [False] * 3, "none waits for the first one's row lock"
    assert not _touches(signs, "h1")


def _fails(signs: RecentSigns, host_id: str, error: type[BaseException], seen: list[bool]) -> None:
    """A statement of `host_id` begun now that raises `error`; whether it carried the sign of life goes to `seen`."""
    with signs.signing(host_id) as touch:
        seen.append(touch)
        raise error


@pytest.mark.parametrize("error", [ConnectionResetError, asyncio.CancelledError])
def test_a_touching_statement_that_fails_closes_its_window(error: type[BaseException]) -> None:
    signs, seen = RecentSigns(ManualClock()), list[bool]()
    with pytest.raises(error):
        _fails(signs, "h1", error, seen)
    assert seen == [True]
    assert _touches(signs, "h1"), "the host's next request records its sign of life"


def test_a_statement_that_left_it_out_and_fails_keeps_the_window_of_the_one_that_carried_it() -> None:
    signs = RecentSigns(ManualClock())
    seen: list[bool] = []
    assert _touches(signs, "h1")
    with pytest.raises(ConnectionResetError):
        _fails(signs, "h1", ConnectionResetError, seen)
    assert seen == [False]
    assert not _touches(signs, "h1")


def test_past_the_hosts_it_keeps_it_forgets_only_those_no_longer_recent() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    for n in range(RecentSigns.KEPT - 1):
        assert _touches(signs, f"old{n}")
    clock.advance(RECENT_S)
    assert _touches(signs, "fresh")
    assert _touches(signs, "newest")  # the KEPT-th and one more: the old ones go, the recent stay
    assert len(signs) == 2
    assert not _touches(signs, "fresh")
    assert not _touches(signs, "newest")
    assert _touches(signs, "old0")
