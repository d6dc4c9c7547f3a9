"""The store's SQL status sets come from core's transition table."""

from __future__ import annotations

import pytest

from devsched.core.lifecycle import TRANSITIONS, Trigger, sources
from devsched.core.status import TaskStatus
from devsched.store.statuses import IN_FLIGHT, entering, leaving, sql_list

pytestmark = pytest.mark.unit


def test_sql_lists_follow_the_enums_order() -> None:
    assert sql_list({TaskStatus.DISPATCHED, TaskStatus.ASSIGNED}) == "('assigned', 'dispatched')"
    with pytest.raises(ValueError, match="matches nothing"):
        sql_list(())


@pytest.mark.parametrize("trigger", list(Trigger))
def test_leaving_is_the_tables_sources(trigger: Trigger) -> None:
    expected = sources(trigger)
    if not expected:  # submit: from nothing
        assert trigger is Trigger.SUBMIT
        return
    assert leaving(trigger) == sql_list(expected)


def test_entering_is_the_one_target_of_a_trigger() -> None:
    assert entering(Trigger.SUBMIT) == "'queued'"
    assert entering(Trigger.ASSIGN) == "'assigned'"
    assert entering(Trigger.CLAIM) == "'dispatched'"
    assert entering(Trigger.CANCEL) == "'cancelled'"
    for trigger in Trigger:
        targets = {dst for (_, t), dst in TRANSITIONS.items() if t == trigger}
        assert entering(trigger) == f"'{targets.pop().value}'"


def test_in_flight_is_where_reports_and_expiries_end_a_task() -> None:
    for trigger in (t for t in Trigger if t.value.startswith(("report_", "expire_"))):
        assert leaving(trigger) == IN_FLIGHT
    assert IN_FLIGHT == "('assigned', 'dispatched')"
