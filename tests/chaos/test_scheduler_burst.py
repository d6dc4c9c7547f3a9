"""Two schedulers and two sweepers under a burst of tasks with random lease expiries and cancellations.

Simulated hosts speak the protocol and misbehave on purpose: some claim and go silent, some never claim,
some run slowly and renew until told to stop. The run ends with every task terminal, and the audit trail
shows no device holding two active reservations, attempts numbered 1..n within max_attempts, and every
task's events published exactly once, in a gap-free sequence.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from sqlalchemy import text

from devsched.protocol.subjects import Subjects
from devsched.store import Store
from support.scheduler_harness import (
    Assigned,
    ErrorReply,
    Spawn,
    TestHost,
    api,
    call,
    stream_messages,
    submit,
)

pytestmark = pytest.mark.chaos

TASKS = 300
HOSTS = 4
DEVICES_PER_HOST = 6
#: Largest overlap tolerated between one device's consecutive attempts, in their recorded timestamps.
#: Each transaction reads the clock once, at its start, so an assignment that began just before the
#: report releasing the device may carry a slightly earlier time; a real double reservation overlaps by
#: a whole lease (1 s) or until its report.
CLOCK_SLACK_S = 0.5

_NOT_TERMINAL = text("SELECT count(*) FROM tasks WHERE status NOT IN ('done', 'failed', 'cancelled')")
_TASKS = text("SELECT task_id, status, attempt_count, max_attempts, event_seq FROM tasks")
_ATTEMPTS = text("SELECT task_id, attempt, device_id, status, assigned_at, ended_at FROM attempts ORDER BY assigned_at")
_UNSENT = text("SELECT count(*) FROM outbox_unsent")
_DOUBLED = text(
    "SELECT device_id, count(*) FROM reservations WHERE attempt_status = 'active'"
    " GROUP BY device_id HAVING count(*) > 1"
)


class Agent:
    """One simulated host: handles each assignment in its own task, by a seeded random behaviour."""

    def __init__(self, host: TestHost, rng: random.Random) -> None:
        self.host = host
        self.rng = rng
        self.behaviours: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        last_beat = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - last_beat > 2:
                await self._safe(self.host.request("heartbeat", {}))
                last_beat = time.monotonic()
            try:
                a = await self.host.next_assignment(timeout=0.3)
            except AssertionError:
                continue
            task = asyncio.create_task(self._handle(a))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks)

    async def _safe(self, coro: Any) -> dict[str, Any] | None:
        try:
            return await coro  # type: ignore[no-any-return]
        except ErrorReply as err:
            if err.status != 409:
                self.unexpected.append(f"{err.status} {err.code}")
            return None
        except Exception as exc:
            self.unexpected.append(type(exc).__name__)
            return None

    async def _handle(self, a: Assigned) -> None:
        roll = self.rng.random()
        if roll < 0.10:
            self.behaviours["never_claims"] += 1
            return
        if await self._safe(self.host.claim(a)) is None:
            return
        if roll < 0.25:
            self.behaviours["goes_silent"] += 1
            return
        if roll < 0.40:
            self.behaviours["slow"] += 1
            until = time.monotonic() + self.rng.uniform(0.4, 1.5)
            while time.monotonic() < until:
                await asyncio.sleep(0.25)
                renewed = await self._safe(self.host.renew(a, {"step": "run", "index": 0, "of": 1}))
                if renewed is None:
                    return  # lease lost: a real agent reports failed and is refused; nothing to do
                if renewed["cancel_requested"]:
                    await self._safe(self.host.report(a, "cancelled"))
                    return
            await self._safe(self.host.report(a, "done"))
            return
        self.behaviours["quick"] += 1
        await self._safe(self.host.report(a, "failed" if roll > 0.93 else "done"))


async def test_two_schedulers_two_sweepers_burst_ends_consistent(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, database_url: str, make_host: Callable[..., TestHost]
) -> None:
    rng = random.Random(20261130)
    procs = [spawn("scheduler"), spawn("scheduler"), spawn("sweeper"), spawn("sweeper")]
    await asyncio.gather(*(p.wait_logged("serving" if i < 2 else "sweeping") for i, p in enumerate(procs)))
    agents = []
    for h in range(HOSTS):
        host = make_host(f"burst-{h}")
        await host.register(*(f"burst-{h}-d{d}" for d in range(DEVICES_PER_HOST)))
        agents.append(Agent(host, random.Random(rng.random())))
    stop = asyncio.Event()
    running = [asyncio.create_task(agent.run(stop)) for agent in agents]

    store = Store.connect(database_url)
    doubled: list[Any] = []

    async def watch_reservations() -> None:
        while not stop.is_set():
            async with store.engine.connect() as conn:
                rows = await conn.execute(_DOUBLED)
                doubled.extend(rows.all())
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_reservations())
    try:
        ids = await asyncio.gather(
            *(
                submit(nc, subject_prefix, lease_ttl_s=1, max_attempts=rng.randint(1, 3), priority=rng.randint(-5, 5))
                for _ in range(TASKS)
            )
        )
        to_cancel = rng.sample(ids, TASKS // 8)
        for task_id in to_cancel:
            await asyncio.sleep(rng.uniform(0, 0.01))
            await call(nc, api(subject_prefix, "tasks.cancel"), {"task_id": task_id, "reason": "burst"})

        deadline = time.monotonic() + 120
        while True:
            async with store.engine.connect() as conn:
                left = (
                    await conn.execute(
                        text("SELECT count(*) FROM tasks WHERE status NOT IN ('done','failed','cancelled')")
                    )
                ).scalar_one()
            if left == 0:
                break
            assert time.monotonic() < deadline, f"{left} tasks still not terminal"
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*running, watcher)

    try:
        await _check_audit_trail(store, nc, subject_prefix, len(ids))
        assert doubled == []
        assert [u for agent in agents for u in agent.unexpected] == []
        behaviours = sum((agent.behaviours for agent in agents), Counter())
        assert all(behaviours[k] > 0 for k in ("never_claims", "goes_silent", "slow", "quick")), behaviours
    finally:
        await store.close()
    for proc in procs:
        assert proc.stop() == 0, proc.tail()


async def _check_audit_trail(store: Store, nc: NatsClient, prefix: str, total: int) -> None:
    async with store.engine.connect() as conn:
        tasks = (await conn.execute(_TASKS)).all()
        attempts = (await conn.execute(_ATTEMPTS)).all()
        unsent = (await conn.execute(_UNSENT)).scalar_one()
    assert len(tasks) == total
    assert {t.status for t in tasks} <= {"done", "failed", "cancelled"}
    assert all(t.attempt_count <= t.max_attempts for t in tasks)
    by_task: dict[Any, list[int]] = defaultdict(list)
    for a in attempts:
        by_task[a.task_id].append(a.attempt)
        assert a.status != "active"
    for t in tasks:
        assert sorted(by_task[t.task_id]) == list(range(1, t.attempt_count + 1))
    expired = sum(a.status == "expired" for a in attempts)
    assert expired > 0  # the run did exercise expiries

    by_device: dict[str, list[Any]] = defaultdict(list)
    for a in attempts:
        by_device[a.device_id].append(a)
    worst = 0.0
    for rows in by_device.values():
        for earlier, later in itertools.pairwise(rows):
            worst = max(worst, (earlier.ended_at - later.assigned_at).total_seconds())
    assert worst <= CLOCK_SLACK_S, f"a device held two attempts at once for {worst:.3f} s"

    # Events: with two relays publishing, each task's events are in the stream once, seq 1..n.
    assert unsent == 0 or await _drained(store)
    messages = await stream_messages(nc.jetstream(), Subjects(prefix).events_stream)
    seqs: dict[str, list[int]] = defaultdict(list)
    task_subjects = f"{prefix}.events.task."  # device events (quarantines of the silent hosts' devices) aside
    for m in messages:
        if not m.subject.startswith(task_subjects):
            continue
        event = json.loads(m.data)
        seqs[event["task_id"]].append(event["seq"])
    for t in tasks:
        assert sorted(seqs[str(t.task_id)]) == list(range(1, t.event_seq + 1)), t.task_id


async def _drained(store: Store) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if await store.unsent_count() == 0:
            return True
        await asyncio.sleep(0.1)
    return False
