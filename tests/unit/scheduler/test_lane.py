"""The artifact commits' lane (`service.Lane`): bounded in all and per host, places given back."""

from __future__ import annotations

import pytest

from devsched.scheduler.service import Lane

pytestmark = pytest.mark.unit


def test_a_host_gets_at_most_its_part_of_the_lane() -> None:
    lane = Lane(limit=8, per_host=2)
    assert lane.enter("a")
    assert lane.enter("a")
    assert not lane.enter("a"), "a third commit of one host is refused"
    assert lane.enter("b"), "another host still gets in"
    lane.leave("a")
    assert lane.enter("a"), "a place given back is taken again"


def test_the_lane_is_bounded_across_hosts_and_forgets_idle_hosts() -> None:
    lane = Lane(limit=3, per_host=2)
    assert [lane.enter(h) for h in ("a", "b", "c", "d")] == [True, True, True, False]
    for host in ("a", "b", "c"):
        lane.leave(host)
    assert lane.running == 0
    assert not lane.by_host, "no host is remembered once its commits ended"
