"""Selectors and the greedy assignment plan."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsched.core.matching import matches, plan_assignments
from devsched.core.records import DeviceRecord, QueuedTask, Selector

pytestmark = pytest.mark.unit

PIXEL = DeviceRecord("pixel-1", "h1", {"platform": "android", "model": "pixel7"})
IPHONE = DeviceRecord("iphone-1", "h1", {"platform": "ios"})
BARE = DeviceRecord("board-1", "h2", {})


def queued(labels: dict[str, str] | None = None, device_id: str | None = None) -> QueuedTask:
    return QueuedTask(uuid.uuid4(), Selector(labels or {}, device_id))


# --- matches -----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [PIXEL, IPHONE, BARE])
def test_empty_selector_matches_every_device(device: DeviceRecord) -> None:
    assert matches(Selector(), device)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"platform": "android"}, True),
        ({"platform": "android", "model": "pixel7"}, True),
        ({"model": "pixel7"}, True),
        ({"platform": "ios"}, False),
        ({"platform": "android", "model": "pixel8"}, False),
        ({"platform": "android", "rack": "3"}, False),
        ({"Platform": "android"}, False),
        ({"platform": "Android"}, False),
        ({"platform": ""}, False),
    ],
)
def test_labels_must_be_contained(labels: dict[str, str], expected: bool) -> None:
    assert matches(Selector(labels), PIXEL) is expected


def test_device_without_labels_matches_only_an_empty_label_selector() -> None:
    assert matches(Selector({}), BARE)
    assert not matches(Selector({"platform": "android"}), BARE)


def test_device_id_selector() -> None:
    assert matches(Selector(device_id="pixel-1"), PIXEL)
    assert not matches(Selector(device_id="pixel-1"), IPHONE)
    assert matches(Selector({"platform": "android"}, "pixel-1"), PIXEL)
    assert not matches(Selector({"platform": "ios"}, "pixel-1"), PIXEL)
    assert not matches(Selector(device_id="pixel"), PIXEL)


# --- plan_assignments --------------------------------------------------------------------------


def test_higher_priority_task_earlier_in_the_list_gets_the_device() -> None:
    high, low = queued({"platform": "android"}), queued({"platform": "android"})
    assert plan_assignments([high, low], [PIXEL]) == [(high, PIXEL)]
    assert plan_assignments([low, high], [PIXEL]) == [(low, PIXEL)]


def test_a_task_that_matches_nothing_does_not_block_later_ones() -> None:
    ios_only, anything = queued({"platform": "ios"}), queued()
    assert plan_assignments([ios_only, anything], [PIXEL]) == [(anything, PIXEL)]


def test_devices_are_tried_in_the_given_order() -> None:
    t = queued()
    assert plan_assignments([t], [IPHONE, PIXEL]) == [(t, IPHONE)]
    assert plan_assignments([t], [PIXEL, IPHONE]) == [(t, PIXEL)]


def test_greedy_does_not_reshuffle_for_a_later_task() -> None:
    # The earlier task takes the first match even if a later task could only use that one device:
    # priority first, never a lower-priority task ahead of a higher one.
    anything, pixel_only = queued(), queued(device_id="pixel-1")
    assert plan_assignments([anything, pixel_only], [PIXEL, IPHONE]) == [(anything, PIXEL)]


def test_nothing_to_plan() -> None:
    assert plan_assignments([], [PIXEL]) == []
    assert plan_assignments([queued()], []) == []


def test_devices_may_be_any_iterable() -> None:
    t1, t2 = queued(), queued()
    assert plan_assignments([t1, t2], iter([PIXEL, IPHONE])) == [(t1, PIXEL), (t2, IPHONE)]


# --- plan_assignments, as properties ------------------------------------------------------------

KEYS = ["platform", "model", "rack"]
VALUES = ["a", "b"]
labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
devices = st.lists(labels, max_size=8).map(
    lambda ls: [DeviceRecord(f"d{i}", f"h{i % 3}", lab) for i, lab in enumerate(ls)]
)


@st.composite
def tasks_and_devices(draw: st.DrawFn) -> tuple[list[QueuedTask], list[DeviceRecord]]:
    devs = draw(devices)
    ids = [d.device_id for d in devs] + ["d-missing"]
    selectors = st.builds(
        Selector,
        labels=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
        device_id=st.one_of(st.none(), st.none(), st.sampled_from(ids)),
    )
    tasks = draw(st.lists(st.builds(QueuedTask, st.uuids(), selectors), max_size=10))
    return tasks, devs


@settings(max_examples=200, deadline=None)
@given(tasks_and_devices())
def test_plan_is_a_matching_in_priority_order(case: tuple[list[QueuedTask], list[DeviceRecord]]) -> None:
    tasks, devs = case
    plan = plan_assignments(tasks, devs)
    planned_tasks = [t for t, _ in plan]
    planned_devices = [d.device_id for _, d in plan]

    # never a device twice, never a task twice, never a device that is not offered
    assert len(set(planned_devices)) == len(planned_devices)
    assert len({t.task_id for t in planned_tasks}) == len(planned_tasks)
    assert all(any(d is offered for offered in devs) for _, d in plan)
    # never a device that does not match
    assert all(matches(t.selector, d) for t, d in plan)
    # the plan follows the task order
    index = {id(t): i for i, t in enumerate(tasks)}
    assert [index[id(t)] for t in planned_tasks] == sorted(index[id(t)] for t in planned_tasks)

    taken_by = {d.device_id: index[id(t)] for t, d in plan}
    for i, t in enumerate(tasks):
        got = next((d for tt, d in plan if tt is t), None)
        usable = [d for d in devs if matches(t.selector, d)]
        if got is None:
            # an unserved task could use nothing but devices already taken by earlier tasks
            assert all(taken_by.get(d.device_id, i) < i for d in usable)
        else:
            # it got the first matching device in the given order that no earlier task took
            for d in usable[: usable.index(got)]:
                assert taken_by.get(d.device_id, i) < i


@settings(max_examples=100, deadline=None)
@given(devices)
def test_empty_selectors_fill_every_device(devs: list[DeviceRecord]) -> None:
    tasks = [queued() for _ in range(len(devs) + 1)]
    plan = plan_assignments(tasks, devs)
    assert [d for _, d in plan] == devs
    assert [t for t, _ in plan] == tasks[: len(devs)]
