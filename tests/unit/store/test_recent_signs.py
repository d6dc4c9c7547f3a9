"""`RecentSigns`: which renewals may leave the host's sign of life out, by the store's clock."""

from __future__ import annotations

import pytest

from devsched.store import ManualClock
from devsched.store.liveness import RECENT_S, RecentSigns

pytestmark = pytest.mark.unit


def test_a_host_is_due_until_recorded_and_again_once_recent_s_has_passed() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    assert signs.due("h1")
    signs.committed("h1", touched=True)
    assert not signs.due("h1")
    assert signs.due("h2"), "each host on its own"
    signs.committed("h2", touched=False)
    assert signs.due("h2"), "a statement that left it out records nothing"
    clock.advance(RECENT_S * 0.99)
    assert not signs.due("h1")
    clock.advance(RECENT_S * 0.01)
    assert signs.due("h1")


def test_past_the_hosts_it_keeps_it_forgets_only_those_no_longer_recent() -> None:
    clock = ManualClock()
    signs = RecentSigns(clock)
    for n in range(RecentSigns.KEPT - 1):
        signs.committed(f"old{n}", touched=True)
    clock.advance(RECENT_S)
    signs.committed("fresh", touched=True)
    signs.committed("newest", touched=True)  # the KEPT-th and one more: the old ones go, the recent stay
    assert not signs.due("fresh")
    assert not signs.due("newest")
    assert signs.due("old0")
    assert len(signs) == 2
