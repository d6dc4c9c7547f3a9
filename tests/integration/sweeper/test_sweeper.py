"""The sweeper's pass: every expired lease ended, batch after batch, each logged once."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from sqlalchemy import text

from devsched.core.status import TaskStatus
from devsched.protocol.codec import decode
from devsched.protocol.subjects import Subjects
from devsched.protocol.wake import Wake
from devsched.service import flush_subscriptions
from devsched.store import DeviceSpec, NewTask, Store
from devsched.sweeper.app import Sweeper, SweeperSettings
from support.databases import service_url
from support.polling import eventually
from support.store_lab import PLAN

pytestmark = pytest.mark.integration


async def test_a_sweep_ends_every_expired_lease_in_batches_and_logs_each_once_in_its_batch_line(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store.connect(database_url)
    try:
        await store.register_host("h1", [DeviceSpec(f"d{i}") for i in range(5)])
        ids = {(await store.submit(NewTask(plan=PLAN, lease_ttl_s=1))).task_id for _ in range(5)}
        assigned = await store.assign()
        assert {m.task_id for m in assigned} == ids
        await asyncio.sleep(1.2)  # the leases run out (the database's clock)
        sweeper = Sweeper(SweeperSettings(database_url=service_url(database_url, "sweeper"), sweep_batch=2))
        sweeper._store = Store.connect(sweeper.settings.database_url)
        try:
            with caplog.at_level(logging.INFO, logger="devsched.sweeper"):
                assert await sweeper.sweep() == 5
                assert await sweeper.sweep() == 0
        finally:
            await sweeper._store.close()
        # one line per batch (of at most 2), listing each lease once; none per lease at INFO
        logged = [r for r in caplog.records if r.getMessage() == "leases expired"]
        assert sum(r.count for r in logged) == 5
        assert all(1 <= r.count <= 2 for r in logged)
        leases = [lease for r in logged for lease in r.leases.split()]
        assert sorted(leases) == sorted(f"{i}/1" for i in ids)
        assert sum(r.queued for r in logged) == 5
        assert not [r for r in caplog.records if r.getMessage() == "lease expired"]
        for task_id in ids:
            assert (await store.get_task(task_id)).status is TaskStatus.QUEUED
    finally:
        await store.close()


async def test_the_sweeper_prunes_ended_tasks_older_than_the_retention_as_its_own_role(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store.connect(database_url)
    try:
        ids = [(await store.submit(NewTask(plan=PLAN))).task_id for _ in range(5)]
        for task_id in ids[:3]:
            await store.request_cancel(task_id, "old")  # queued: cancelled at once
        async with store.engine.begin() as conn:
            await conn.execute(
                text("UPDATE tasks SET created_at = now() - interval '8 days', updated_at = now() - interval '8 days'")
            )
        settings = SweeperSettings(
            database_url=service_url(database_url, "sweeper"), retention_days=7, prune_batch=2, sweep_interval_s=0.1
        )
        sweeper = Sweeper(settings)
        stop = asyncio.Event()
        with caplog.at_level(logging.INFO, logger="devsched.sweeper"):
            running = asyncio.create_task(sweeper.run(stop))
            await eventually(lambda: sweeper.pruned == 3, timeout=20, message="3 ended tasks pruned")
            stop.set()
            await asyncio.wait_for(running, 20)
        assert [r.pruned for r in caplog.records if r.getMessage() == "pruned ended tasks"] == [3]
        async with store.engine.connect() as conn:
            left = set((await conn.execute(text("SELECT task_id FROM tasks"))).scalars().all())
        assert left == set(ids[3:])  # the queued ones stay, however old
    finally:
        await store.close()


def test_a_retention_under_an_hour_is_refused_and_zero_keeps_forever() -> None:
    with pytest.raises(ValueError, match="shorter than the least allowed"):
        SweeperSettings(retention_days=0.01)
    assert SweeperSettings(retention_days=0).retention is None
    assert SweeperSettings().retention_days == 30


async def test_the_sweeper_wakes_the_schedulers_with_how_many_leases_it_released(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient
) -> None:
    store = Store.connect(database_url)
    wakes: asyncio.Queue[Wake] = asyncio.Queue()

    async def on_wake(msg: Msg) -> None:
        wakes.put_nowait(decode(Wake, msg.data))

    await nc.subscribe(Subjects(subject_prefix).internal_wake, cb=on_wake)
    await flush_subscriptions(nc)
    stop = asyncio.Event()
    running: asyncio.Task[None] | None = None
    try:
        await store.register_host("h1", [DeviceSpec("d1"), DeviceSpec("d2")])
        for _ in range(2):
            await store.submit(NewTask(plan=PLAN, lease_ttl_s=1))
        assert len(await store.assign()) == 2
        await asyncio.sleep(1.2)  # the leases run out (the database's clock)
        settings = SweeperSettings(
            database_url=service_url(database_url, "sweeper"),
            nats_url=nats_url,
            subject_prefix=subject_prefix,
            metrics_port=0,
            sweep_interval_s=0.1,
        )
        running = asyncio.create_task(Sweeper(settings).run(stop))
        wake = await asyncio.wait_for(wakes.get(), 20)
        assert wake == Wake(released=2)
    finally:
        stop.set()
        if running is not None:
            await asyncio.wait_for(running, 20)
        await store.close()
