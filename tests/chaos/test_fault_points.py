"""Services killed at named fault points (`devsched.store.faults`, armed by `DEVSCHED_FAULT_POINT`): in the middle
of a reservation, of a report's hand-over, of a submit's placement, of a sweep batch, and between a relay's
publish and its mark. Whatever the dead process had not committed is rolled back by the database; what a
replacement does next is exactly once.

Each scenario asserts its own expected outcome and ends with the shared invariant checker.
"""

from __future__ import annotations

import signal
import uuid

import asyncpg
import nats.errors
import pytest

from devsched.protocol.subjects import Subjects
from devsched.store.faults import FAULT_POINT_ENV
from support.fault_lab import FaultLab, MakeLab, extra_service
from support.invariants import plain_dsn
from support.polling import eventually
from support.scheduler_harness import ErrorReply, ServiceProcess, api, call, task_events

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


async def _rows(database_url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(plain_dsn(database_url))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _died_at(process: ServiceProcess, name: str) -> None:
    assert await process.wait_exit(timeout=30) == -signal.SIGKILL, process.tail()
    assert f"fault point {name}: killing process" in process.log_text()


async def test_a_scheduler_killed_in_the_middle_of_a_reservation_reserves_nothing(
    make_lab: MakeLab, database_url: str
) -> None:
    lab: FaultLab = await make_lab(env={FAULT_POINT_ENV: "assign.after_reserve"})
    task_id = await lab.submit(lab.journal.plan(0.2, 0.2), lease_ttl_s=10)  # no device yet: nothing to assign
    agent = lab.agent("d1")  # its registration wakes the assignment loop, which dies in mid-transaction
    await _died_at(lab.plane.scheduler, "assign.after_reserve")

    assert await _rows(database_url, "SELECT * FROM attempts") == []
    assert await _rows(database_url, "SELECT * FROM reservations") == []
    (task,) = await _rows(database_url, "SELECT status, attempt_count FROM tasks")
    assert (task["status"], task["attempt_count"]) == ("queued", 0)
    kinds = await _rows(database_url, "SELECT kind, data->>'kind' AS event FROM outbox ORDER BY id")
    assert [(r["kind"], r["event"]) for r in kinds] == [("task_event", "submitted")]

    del lab.plane.env[FAULT_POINT_ENV]
    await lab.plane.start_scheduler().wait_logged("serving")
    await agent.ready()
    view = await lab.wait_status(task_id, "done", "failed", within=30)
    assert [(a["attempt"], a["status"]) for a in view["attempts"]] == [(1, "done")]
    await lab.inv.check()


async def test_a_scheduler_killed_in_the_middle_of_a_reports_hand_over_loses_neither(
    make_lab: MakeLab, database_url: str
) -> None:
    """The report and the freed device's next attempt are one transaction: both roll back, the agent's retry of
    its report records it, and the device goes to the waiting task then."""
    lab: FaultLab = await make_lab(env={FAULT_POINT_ENV: "handover.after_reserve"})
    first = await lab.submit(lab.journal.plan(0.2), lease_ttl_s=30)  # no device yet: both wait
    waiting = await lab.submit(lab.journal.plan(0.2), lease_ttl_s=30)
    agent = lab.agent("d1")  # the loop gives it the first; its report hands the device to the second, and dies
    await _died_at(lab.plane.scheduler, "handover.after_reserve")

    attempts = await _rows(database_url, "SELECT task_id::text, attempt, status FROM attempts")
    assert [(r["task_id"], r["attempt"], r["status"]) for r in attempts] == [(first, 1, "active")]
    statuses = await _rows(database_url, "SELECT task_id::text, status FROM tasks ORDER BY created_at")
    assert [(r["task_id"], r["status"]) for r in statuses] == [(first, "dispatched"), (waiting, "queued")]

    del lab.plane.env[FAULT_POINT_ENV]
    await lab.plane.start_scheduler().wait_logged("serving")
    await agent.ready()
    views = await lab.run_all([first, waiting], within=40)  # the agent reports again; the device is handed over
    assert {t: [(a["attempt"], a["status"]) for a in v["attempts"]] for t, v in views.items()} == {
        first: [(1, "done")],
        waiting: [(1, "done")],
    }
    await lab.inv.check()


async def test_a_scheduler_killed_in_a_submits_placement_loses_nothing_and_the_retry_runs_it_once(
    make_lab: MakeLab, database_url: str
) -> None:
    """The submit and its placement are one transaction: both roll back; the client's retry (same key) submits
    and places the task then."""
    lab: FaultLab = await make_lab(env={FAULT_POINT_ENV: "placement.after_reserve"})
    agent = await lab.agent("d1").ready()  # a free device: the submit places its task, and dies before the commit
    key = f"k-{uuid.uuid4().hex}"
    body = {"selector": {"labels": lab.label}, "plan": {"steps": lab.journal.plan(0.2)}, "idempotency_key": key}
    with pytest.raises((nats.errors.TimeoutError, ErrorReply)):
        await call(lab.nc, api(lab.prefix, "tasks.submit"), body, timeout=3)
    await _died_at(lab.plane.scheduler, "placement.after_reserve")
    for table in ("tasks", "attempts", "reservations", "outbox"):
        assert await _rows(database_url, f"SELECT * FROM {table}") == [], table

    del lab.plane.env[FAULT_POINT_ENV]
    await lab.plane.start_scheduler().wait_logged("serving")
    await agent.ready()
    again = await call(lab.nc, api(lab.prefix, "tasks.submit"), body)  # the client's retry, same key
    assert again["created"] is True, "the first never committed"
    task_id = lab.inv.acknowledge(again["task_id"])
    view = await lab.wait_status(task_id, "done", "failed", within=30)
    assert [(a["attempt"], a["status"]) for a in view["attempts"]] == [(1, "done")]
    await lab.inv.check()


async def test_a_sweeper_killed_in_the_middle_of_a_batch_ends_each_lease_once(
    make_lab: MakeLab, database_url: str
) -> None:
    lab: FaultLab = await make_lab(env={FAULT_POINT_ENV: "sweep.after_expire"})
    agent = await lab.agent("d1", "d2", "d3").ready()
    tasks = [await lab.submit(lab.journal.plan(*[0.3] * 10), lease_ttl_s=2, max_attempts=1) for _ in range(3)]
    await eventually(lambda: len({r.task_id for r in lab.journal.runs()}) == 3, timeout=20, message="all running")
    doomed = lab.plane.sweeper
    async with lab.inv.watch():
        doomed.pause()  # its next sweep finds the three leases expired at once: one batch
        agent.process.pause()  # a hung host: no renewal, no report

        async def all_expired() -> bool:
            rows = await _rows(
                database_url, "SELECT count(*) FROM attempts WHERE status = 'active' AND expires_at < clock_timestamp()"
            )
            return bool(rows[0][0] == 3)

        await eventually(all_expired, timeout=20, message="three leases expired")
        doomed.resume()
        await _died_at(doomed, "sweep.after_expire")
        active = await _rows(database_url, "SELECT count(*) FROM attempts WHERE status = 'active'")
        assert active[0][0] == 3  # the batch rolled back: no attempt ended, no task decided

        await extra_service(lab.plane, "sweeper", env={FAULT_POINT_ENV: None}).wait_logged("sweeping")
        views = await lab.run_all(tasks, within=30)
        agent.process.resume()  # past its deadline: it starts no step of the expired attempts
        await agent.wait_line("attempt ended", task_id=tasks[0], timeout=20)

    assert {(v["status"], v["reason"]) for v in views.values()} == {("failed", "lease_expired")}
    for task_id in tasks:
        events = [e["event"] for e in await task_events(lab.nc.jetstream(), lab.prefix, task_id)]
        assert events.count("failed") == 1
    await lab.inv.check()


async def test_a_scheduler_killed_between_publishing_and_marking_publishes_each_event_once(
    make_lab: MakeLab, database_url: str
) -> None:
    lab: FaultLab = await make_lab(env={FAULT_POINT_ENV: "relay.after_publish"})
    key = f"k-{uuid.uuid4().hex}"
    body = {"selector": {"labels": lab.label}, "plan": {"steps": lab.journal.plan(0.2)}, "idempotency_key": key}
    try:  # the relay, woken by this commit, may die before the reply is out
        first: str | None = (await call(lab.nc, api(lab.prefix, "tasks.submit"), body, timeout=3))["task_id"]
    except (nats.errors.TimeoutError, ErrorReply):
        first = None
    await _died_at(lab.plane.scheduler, "relay.after_publish")

    (row,) = await _rows(database_url, "SELECT id IN (SELECT id FROM outbox_unsent) AS unsent FROM outbox")
    assert row["unsent"]  # published, never recorded so
    published = await lab.nc.jetstream().stream_info(Subjects(lab.prefix).events_stream)
    assert published.state.messages == 1

    del lab.plane.env[FAULT_POINT_ENV]
    await lab.plane.start_scheduler().wait_logged("serving")
    again = await call(lab.nc, api(lab.prefix, "tasks.submit"), body)  # the client's retry, same key
    assert again["created"] is False
    assert first in (None, again["task_id"])
    task_id = lab.inv.acknowledge(again["task_id"])
    await lab.agent("d1").ready()
    await lab.wait_status(task_id, "done", within=30)

    events = [e["event"] for e in await task_events(lab.nc.jetstream(), lab.prefix, task_id)]
    assert events == ["submitted", "assigned", "dispatched", "progress", "done"]  # republished, deduplicated
    await lab.inv.check()
