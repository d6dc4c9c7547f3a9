"""A submitted task placed on a free device it could use, in one statement after the submit's own.

In the submit's transaction (`Store.submit`, `assign_inline`): one statement looks at up to
`candidates.SUBMIT_DEVICES` free devices the new task could use and at the head of the queue
(`candidates.HEAD` tasks, by priority then age, the new task among them), takes the first pair of a
matching task and device in that order (the queue's, then the devices' as the loop orders them) whose task
and device no other transaction holds, locks both (SKIP LOCKED, checked again on the versions locked),
and applies it as a hand-over does (`pairing`). So a task ahead of the new one that matches one of those
devices takes it first, as the loop's greedy plan (`devsched.core.matching`) would; the new task then
waits for the loop's pass, which the outcome asks for.

One pair at most: a free device and a task it could take both queued is the loop's business, and only
arises while a pass is on its way. Locking a pair locks its task first: when the task is free but the
device is held, the task stays locked (unused) until the commit, and assigners that meet it skip it and
leave it to a pass. The partial unique indexes stay the last word, as in `assignment`.

A submit whose selector found no free device the last time it looked needs no placement at all: its
statement counts the free devices the new task could use itself (`tasks.submit_looking`) and commits on
its own; only when it finds some does this statement run, in a transaction of its own right after (the
task is committed and queued by then, so it is one of the head's like any other). `Store.submit` keeps
those selectors (`NothingFree`); a count that was right is what this statement would have found, so the
outcome is the same (tests/integration/store/test_placement.py compares both paths on generated states).
"""

from __future__ import annotations

import json
import uuid

from devsched.core.events import AttemptAssigned
from devsched.core.records import Selector
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED
from devsched.store.outbox import inserted
from devsched.store.placement import candidates, pairing
from devsched.store.placement.assignment import Outcome
from devsched.store.views import OutboxMessage

#: Selectors remembered by `NothingFree` before it starts over (a forgotten one costs one placement).
_REMEMBERED = 4096

#: Matching tasks of the head the statement may pair in turn when other transactions hold the first ones.
_CANDIDATES = 4 * candidates.SUBMIT_DEVICES

_PLACE = Sql(
    f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    {candidates.SUBMITTED_FREE},
    {candidates.QUEUE_HEAD},
    {candidates.MATCHED},
    -- the first pair still queued and free (checked again on the versions locked) that no other transaction
    -- holds; the task found by id: `IS TRUE` keeps the status a filter, never a scan of the status index,
    -- which a planner whose statistics lag behind the queue would otherwise choose
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, t.lease_ttl_s, t.plan, t.trace_headers, d.device_id,
               d.host_id
        FROM m JOIN f ON {candidates.matching("m", "f")}
             JOIN tasks t ON t.task_id = m.task_id
             JOIN devices d ON d.device_id = f.device_id
        WHERE (t.status IN {candidates.QUEUED}) IS TRUE AND d.registered AND NOT d.drained
          AND d.quarantined_at IS NULL
          AND NOT {device_busy("d")}
        -- a retried task prefers another device than the one it failed on, and takes that one if it is the only
        ORDER BY m.priority DESC, m.created_at, m.task_id, f.device_id IS NOT DISTINCT FROM m.avoid_device_id,
                 f.updated_at, f.device_id
        LIMIT 1
        FOR UPDATE OF t, d SKIP LOCKED
    ),
    -- the task and the device are locked, still queued and free, by this statement
    {pairing.apply("chosen", "chosen")}
    SELECT (SELECT count(*) FROM f) AS free, (SELECT task_id FROM moved) AS placed, {INSERTED} AS inserted
    """
)


async def place(
    db: Driver, clock: Clock, task_id: uuid.UUID, selector: Selector, written: list[OutboxMessage]
) -> tuple[Outcome, int]:
    """The submitted `task_id` (queued in this transaction or just committed), or a task ahead, onto a free device.

    `written` receives the two outbox messages of an assignment. Settled when the new task was placed, or
    no device it could use is left free (there was none, or a task ahead took the only one); otherwise (a
    task ahead took one of several, others held them, the new task is past the head) the loop's pass may
    place it. Second, the free devices the new task could use that the statement found (at most
    `candidates.SUBMIT_DEVICES`).
    """
    params = {
        "labels": json.dumps(dict(selector.labels)),
        "device_id": selector.device_id,
        "devices": candidates.SUBMIT_DEVICES,
        "scan": candidates.HEAD,
        "limit": _CANDIDATES,
        **pairing.params(),
        CLOCK_PARAM: clock.bound(),
    }
    row = await db.row(_PLACE, params)
    assert row is not None, "the statement returns one row"
    messages = inserted(row["inserted"])
    if messages:
        point("placement.after_reserve")  # the task and its reservation are written, not yet committed
    written += messages
    assigned = [m.event for m in messages if isinstance(m.event, AttemptAssigned)]
    left = row["free"] - len(assigned)
    return Outcome(assigned, settled=row["placed"] == task_id or left == 0), row["free"]


#: A selector as `NothingFree` keeps it: its labels, sorted, and its device.
SelectorKey = tuple[tuple[tuple[str, str], ...], str | None]


class NothingFree:
    """The selectors whose last placement (or counting submit) found no free device they could use.

    A hint, never a rule: a submit with one of them counts the free devices in its own statement and places
    its task after all when it finds some (and the selector is forgotten); one without it places in the
    submit's transaction. Either way the task is placed where a placement would have put it then, or left
    to the loop's pass when none is free. Per process: another replica's submits only make it stale, which
    costs the next submit of that selector one more commit.
    """

    __slots__ = ("_keys", "_limit")

    def __init__(self, limit: int = _REMEMBERED) -> None:
        self._keys: set[SelectorKey] = set()
        self._limit = limit

    @staticmethod
    def key(selector: Selector) -> SelectorKey:
        """The selector's key: its labels (sorted) and its device."""
        return tuple(sorted(selector.labels.items())), selector.device_id

    def __contains__(self, key: SelectorKey) -> bool:
        return key in self._keys

    def saw(self, key: SelectorKey, free: int) -> None:
        """A look at the selector's free devices found `free` of them."""
        if free:
            self._keys.discard(key)
            return
        if len(self._keys) >= self._limit:
            self._keys.clear()
        self._keys.add(key)
