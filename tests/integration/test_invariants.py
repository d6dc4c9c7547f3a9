"""The fault suite's invariant checker can fail: a real history passes, and each kind of damage done to it is caught.

The history is made by a scheduler and a sweeper in this process and a protocol-speaking host: one task done,
one whose lease expired at its last attempt. Then the database, the events stream or the step journal is
damaged one way at a time (each undone before the next where it can be) and `check()` must say what is wrong.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NatsClient

from devsched.sweeper.app import SweeperSettings
from support.invariants import Invariants, plain_dsn, stream_name
from support.outbox_rows import ALL_BUT_THE_FIRST_PUBLISHED, ALL_PUBLISHED
from support.scheduler_harness import (
    TestHost,
    delete_streams,
    running_scheduler,
    running_sweeper,
    scheduler_settings,
    status_of,
    submit,
)
from support.step_journal import StepJournal

pytestmark = pytest.mark.integration


async def _sql(database_url: str, statement: str, *args: object) -> None:
    conn = await asyncpg.connect(plain_dsn(database_url))
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def test_the_checker_passes_a_real_history_and_catches_each_kind_of_damage(
    database_url: str,
    nats_url: str,
    subject_prefix: str,
    nc: NatsClient,
    make_host: Callable[..., TestHost],
    tmp_path: Path,
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix)
    sweeper = SweeperSettings(
        database_url=database_url, nats_url=nats_url, subject_prefix=subject_prefix, sweep_interval_s=0.1
    )
    journal = StepJournal(tmp_path / "journal")
    inv = Invariants(database_url, subject_prefix, nc=nc, journal=journal)
    try:
        async with running_scheduler(settings), running_sweeper(sweeper):
            host = make_host()
            await host.register("d1", "d2")
            done = inv.acknowledge(await submit(nc, subject_prefix))
            expired = inv.acknowledge(await submit(nc, subject_prefix, lease_ttl_s=1, max_attempts=1))
            for assignment in await host.assignments(2):
                if assignment.task_id == done:
                    await host.claim(assignment)
                    await host.report(assignment)
                    done_device = assignment.body["device_id"]
                else:
                    expired_device = assignment.body["device_id"]
            await status_of(nc, subject_prefix, done, "done")
            await status_of(nc, subject_prefix, expired, "failed")
            async with inv.watch():
                await inv.check()  # a real history passes

            # Steps the journal says ran: the done attempt's, and one of the expired attempt's, started in time.
            lines = [
                f"start {done} 1 {done_device} s1 1.0",
                f"end {done} 1 {done_device} s1 1.1",
                f"start {expired} 1 {expired_device} s1 1.2",
            ]
            journal.path.write_text("\n".join(lines) + "\n")
            await inv.check()

            journal.path.write_text("\n".join([*lines, f"overlap {expired} 1 {done_device} s1"]) + "\n")
            with pytest.raises(AssertionError, match="while another attempt's step held the device"):
                await inv.check()
            late = f"start {expired} 1 {expired_device} s2 {_boot_seconds_now() + 5:.2f}"  # after its lease's expiry
            journal.path.write_text("\n".join([*lines, late]) + "\n")
            with pytest.raises(AssertionError, match="started after the lease's expiry"):
                await inv.check()
            journal.path.write_text("")

            lost = str(uuid.uuid4())
            inv.acknowledge(lost)
            with pytest.raises(AssertionError, match="acknowledged tasks missing"):
                await inv.check()
            inv.acknowledged.discard(lost)

            # another terminal state, not `queued`: the live scheduler would assign a queued task again
            await _sql(database_url, "UPDATE tasks SET status = 'cancelled' WHERE task_id = $1", uuid.UUID(done))
            with pytest.raises(AssertionError, match="a terminal state changed"):
                await inv.check()
            await _sql(database_url, "UPDATE tasks SET status = 'done' WHERE task_id = $1", uuid.UUID(done))

            await _sql(
                database_url,
                "UPDATE attempts SET assigned_at = assigned_at - interval '1 hour' WHERE task_id = $1",
                uuid.UUID(expired),
            )
            await _sql(
                database_url, "UPDATE attempts SET device_id = $1 WHERE task_id = $2", done_device, uuid.UUID(expired)
            )
        # no scheduler now: nothing relays, nothing repairs
        with pytest.raises(AssertionError, match="assigned at"):
            await inv.check()
        await _sql(database_url, "DELETE FROM attempts WHERE task_id = $1", uuid.UUID(expired))
        inv.acknowledged.discard(expired)
        await _sql(
            database_url, "UPDATE tasks SET attempt_count = 0, status = 'queued' WHERE task_id = $1", uuid.UUID(expired)
        )
        inv.terminal_seen.pop(expired)

        await _sql(database_url, ALL_BUT_THE_FIRST_PUBLISHED)
        with pytest.raises(AssertionError, match="every outbox row published"):
            await inv.check(publish_timeout=0.5)
        await _sql(database_url, ALL_PUBLISHED)

        first = {"event": "submitted", "task_id": done, "seq": 1, "status": "queued", "at": "2026-01-01T00:00:00Z"}
        await nc.jetstream().publish(
            f"{subject_prefix}.events.task.{done}", json.dumps(first).encode(), headers={"Nats-Msg-Id": "again"}
        )
        with pytest.raises(AssertionError, match="events stream holds"):
            await inv.check()
        assert stream_name(subject_prefix, "EVENTS") == f"{subject_prefix.upper()}_EVENTS"

        inv.acknowledge(expired)  # queued again, and no scheduler to give it a device
        with pytest.raises(AssertionError, match="queued tasks on a device"):
            await inv.recovered(await inv.db_now(), ttl_s=0.1, sweep_interval_s=0.1, grace_s=0.0)
    finally:
        await delete_streams(nc, subject_prefix)


def _boot_seconds_now() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])
