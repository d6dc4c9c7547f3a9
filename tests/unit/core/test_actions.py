"""Plug-in actions as reserved labels (`devsched.core.actions`): derived, matched, and kept out of views."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from devsched.core.actions import (
    ACTION_LABEL_PREFIX,
    BUILTIN_ACTIONS,
    action_labels,
    actions_of_labels,
    is_reserved,
    plugin_actions,
    visible_labels,
)
from devsched.core.matching import matches
from devsched.core.records import DeviceRecord, Selector
from devsched.protocol.plans import BUILTIN_ARGS

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-.", min_size=1, max_size=12)


def test_the_builtins_are_the_protocols_builtin_actions() -> None:
    assert set(BUILTIN_ARGS) == BUILTIN_ACTIONS


def test_plugin_actions_leave_out_the_builtins_and_repeats() -> None:
    assert plugin_actions(["shell", "adb-instrument", "sleep", "flash", "adb-instrument"]) == [
        "adb-instrument",
        "flash",
    ]
    assert plugin_actions(["shell", "noop"]) == []
    assert action_labels(["shell"]) == {}


def test_action_labels_round_trip_and_hide_from_views() -> None:
    labels = {"platform": "android", **action_labels(["flash", "adb-instrument"])}
    assert labels["devsched.action.flash"] == "true"
    assert actions_of_labels(labels) == ["adb-instrument", "flash"]
    assert visible_labels(labels) == {"platform": "android"}
    assert is_reserved(ACTION_LABEL_PREFIX + "x")
    assert not is_reserved("devsched.actionx")


@given(needed=st.lists(names, max_size=4), offered=st.lists(names, max_size=4))
def test_a_device_matches_a_plan_exactly_when_its_host_offers_every_plugin(
    needed: list[str], offered: list[str]
) -> None:
    device = DeviceRecord("d1", "h1", {"platform": "android", **action_labels(offered)})
    selector = Selector(labels={"platform": "android", **action_labels(needed)})
    assert matches(selector, device) == (set(plugin_actions(needed)) <= set(plugin_actions(offered)))
