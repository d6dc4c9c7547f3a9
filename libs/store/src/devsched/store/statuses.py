"""The task statuses the store's SQL compares and sets, taken from core's transition table.

Every compare-and-set (`UPDATE ... WHERE status IN (...)`) names the statuses a trigger may leave and
the status it leads to through here, so a change to `devsched.core.lifecycle.TRANSITIONS` changes the SQL
with it. The values are our own enum members, never input: embedding them as SQL literals is safe, and
keeps the statements' text constant for the planner.
"""

from __future__ import annotations

from collections.abc import Iterable

from devsched.core.lifecycle import TRANSITIONS, Trigger, sources
from devsched.core.status import TaskStatus

_ORDER = list(TaskStatus)


def sql_list(statuses: Iterable[TaskStatus]) -> str:
    """`('assigned', 'dispatched')`: an SQL list of statuses, in the enum's order."""
    ordered = sorted(set(statuses), key=_ORDER.index)
    if not ordered:
        raise ValueError("an empty list of statuses matches nothing")
    return "(" + ", ".join(f"'{s.value}'" for s in ordered) + ")"


def leaving(trigger: Trigger) -> str:
    """The SQL list of the statuses `trigger` may move a task out of."""
    return sql_list(sources(trigger))


def entering(trigger: Trigger) -> str:
    """`'assigned'`: the SQL literal of the one status `trigger` moves a task into.

    Raises:
        ValueError: the trigger leads to different statuses from different sources (the caller must then
            pass the status as a parameter).
    """
    targets = {dst for (_, trig), dst in TRANSITIONS.items() if trig == trigger}
    if len(targets) != 1:
        raise ValueError(f"{trigger} leads to {sorted(targets)}: not one status")
    return f"'{next(iter(targets)).value}'"


#: In flight: an attempt holds a lease (a report or an expiry may end the task; a cancel is a request).
IN_FLIGHT = leaving(Trigger.REPORT_DONE)
