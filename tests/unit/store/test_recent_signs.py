"""`RecentSigns`: which renewals may leave the host's sign of life out, by the store's clock."""

from __future__ import annotations

import pytest

from devsched.store import ManualClock
from devsched.store.liveness import RECENT_S, RecentSigns

pytestmark = pytest.mark.unit


def test_a_host_is_recent_for_recent_s_from_when_its_touching_statement_began() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    at = signs.due("h1")
    assert at == clock.current.timestamp()
    clock.advance(RECENT_S * 0.6)  # the statement ran meanwhile
    signs.recorded("h1", at)
    assert signs.due("h1") is None
    assert signs.due("h2") is not None, "each host on its own"
    signs.recorded("h2", None)
    assert signs.due("h2") is not None, "a statement that left it out records nothing"
    clock.advance(RECENT_S * 0.39)
    assert signs.due("h1") is None
    clock.advance(RECENT_S * 0.01)
    assert signs.due("h1") is not None, "RECENT_S after the statement began, not after it committed"


def test_past_the_hosts_it_keeps_it_forgets_only_those_no_longer_recent() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    for n in range(RecentSigns.KEPT - 1):
        signs.recorded(f"old{n}", signs.due(f"old{n}"))
    clock.advance(RECENT_S)
    signs.recorded("fresh", signs.due("fresh"))
    signs.recorded("newest", signs.due("newest"))  # the KEPT-th and one more: the old ones go, the recent stay
    assert signs.due("fresh") is None
    assert signs.due("newest") is None
    assert signs.due("old0") is not None
    assert len(signs) == 2
