"""The one checker of the system's invariants, run at the end of every fault scenario.

It reads the real database (as the superuser, directly: never through a proxy a test broke) and, where a claim
is about what was published, the real JetStream streams. What it checks (ARCHITECTURE "Invariants"):

- one active attempt per task and per device, one active reservation per device;
- every acknowledged task is queued, in flight with exactly its current attempt active, or in one terminal
  state with no attempt active;
- terminal states never change: every status seen terminal by `watch()` is still that status, and in the
  events stream a task's terminal event is its only one and its last;
- attempt numbers run 1..attempt_count without gaps, attempt_count <= max_attempts;
- no two attempts of one device overlap in the database's record (an attempt starts after the previous ended);
- with a step journal (`support.step_journal`): no step of an expired attempt started after its lease's
  expiry (the agent's own deadline falls before it, so this is the agent's deadline with the request's
  latency as slack) and no two attempts' steps ran on one device at the same time;
- every outbox row is sent, and published once: the events stream holds exactly one message per task event
  (seq 1..event_seq, no duplicate) and per device event, and the assignments stream's sequence counted
  exactly one message per assignment row (JetStream drops a republished one by its message id without a
  sequence number), plus the copies the scheduler's resync published (each under an id of its own), as its
  logs count them (`resends`);
- `recovered()`: once a fault heals, every queued task gets a device within ttl + sweep interval + grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NatsClient

from support.polling import eventually
from support.scheduler_harness import stream_messages
from support.step_journal import StepJournal, slack

TERMINAL = frozenset({"done", "failed", "cancelled"})
IN_FLIGHT = frozenset({"assigned", "dispatched"})
#: Added to a recovery bound for what the bound does not name: an assignment tick, the relay, a loaded machine.
RECOVERY_SLACK_S = 3.0


def plain_dsn(url: str) -> str:
    """An asyncpg DSN from a SQLAlchemy URL (`postgresql+asyncpg://` -> `postgresql://`)."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def stream_name(prefix: str, suffix: str) -> str:
    """`<PREFIX>_<SUFFIX>`, the stream names of a subject prefix."""
    return f"{prefix.upper().replace('-', '_')}_{suffix}"


@dataclass
class Invariants:
    """The checker of one scenario: its database, its prefix's streams, the tasks it was told were acknowledged."""

    database_url: str
    prefix: str
    nc: NatsClient | None = None
    journal: StepJournal | None = None
    #: `(acknowledged, unacknowledged)`: the copies of assignments the scheduler's resync published, by its logs
    #: (one it sent without an acknowledgement may or may not be in the stream). None: no copies.
    resends: Callable[[], tuple[int, int]] | None = None
    acknowledged: set[str] = field(default_factory=set)
    #: The first terminal status seen of each task, by `observe()`.
    terminal_seen: dict[str, str] = field(default_factory=dict)

    def acknowledge(self, task_id: str) -> str:
        """Record that a submit of `task_id` was acknowledged (so it must never be lost); returns it."""
        self.acknowledged.add(task_id)
        return task_id

    # -- database access ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await asyncpg.connect(plain_dsn(self.database_url), timeout=10)
        try:
            yield conn
        finally:
            await conn.close()

    async def db_now(self) -> datetime:
        """The database's clock (the one leases are measured by)."""
        async with self._conn() as conn:
            value: datetime = await conn.fetchval("SELECT clock_timestamp()")
            return value

    async def statuses(self) -> dict[str, str]:
        """Every task's status."""
        async with self._conn() as conn:
            return {str(r["task_id"]): r["status"] for r in await conn.fetch("SELECT task_id, status FROM tasks")}

    async def attempts(self, task_id: str) -> list[dict[str, Any]]:
        """The attempts of one task as rows, in order."""
        async with self._conn() as conn:
            rows = await conn.fetch("SELECT * FROM attempts WHERE task_id = $1 ORDER BY attempt", uuid.UUID(task_id))
            return [dict(r) for r in rows]

    # -- history ----------------------------------------------------------------------------------------------

    async def observe(self) -> None:
        """Look at every task once: a task seen terminal must keep that status (unreachable database: skip)."""
        try:
            current = await self.statuses()
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return  # the database is part of the fault; the next look counts
        for task_id, status in current.items():
            first = self.terminal_seen.get(task_id)
            if first is not None:
                assert status == first, f"task {task_id} was {first}, now {status}: a terminal state changed"
            elif status in TERMINAL:
                self.terminal_seen[task_id] = status

    @contextlib.asynccontextmanager
    async def watch(self, interval: float = 0.3) -> AsyncIterator[None]:
        """`observe()` every `interval` seconds in the background for the block (and once at its end)."""
        failure: list[BaseException] = []

        async def loop() -> None:
            while True:
                try:
                    await self.observe()
                except AssertionError as exc:
                    failure.append(exc)
                    return
                await asyncio.sleep(interval)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if failure:
            raise failure[0]
        await self.observe()

    # -- liveness -----------------------------------------------------------------------------------------------

    async def recovered(self, healed_at: datetime, *, ttl_s: float, sweep_interval_s: float, grace_s: float) -> float:
        """Wait until, after the heal at `healed_at` (database clock), no task waits for a device; return how long.

        Done when no acknowledged task is queued and every active attempt is alive after the heal: assigned
        after it, or renewed (or claimed) after it, which moves its expiry past `healed_at + ttl`. An attempt
        whose agent died keeps its older expiry until the sweeper ends it and the task is assigned again. The
        scenario must give the tasks enough devices: this measures recovery, not queueing.

        Raises:
            AssertionError: it took longer than ttl + sweep interval + grace (+ `RECOVERY_SLACK_S`).
        """
        bound = ttl_s + sweep_interval_s + grace_s + RECOVERY_SLACK_S
        started = time.monotonic()
        ids = [uuid.UUID(t) for t in self.acknowledged]
        fresh_after = healed_at + timedelta(seconds=ttl_s)

        async def settled() -> bool:
            async with self._conn() as conn:
                waiting = await conn.fetchval(
                    """
                    SELECT count(*) FROM tasks t
                    WHERE t.task_id = ANY($1::uuid[]) AND (
                        t.status = 'queued'
                        OR EXISTS (SELECT FROM attempts a WHERE a.task_id = t.task_id AND a.status = 'active'
                                   AND a.assigned_at <= $2 AND a.expires_at <= $3))
                    """,
                    ids,
                    healed_at,
                    fresh_after,
                )
            return bool(waiting == 0)

        await eventually(settled, timeout=bound, interval=0.1, message=f"queued tasks on a device in {bound:.1f}s")
        return time.monotonic() - started

    # -- the check ---------------------------------------------------------------------------------------------

    async def check(self, *, publish_timeout: float = 20.0, streams: bool = True) -> None:
        """Check every invariant; the first violation fails the test with what was found.

        `streams=False` leaves out what the streams hold (every outbox row must still be sent): for a scenario
        in which NATS lost its store, and the streams with it.
        """
        await self.observe()
        async with self._conn() as conn:
            await self._check_rows(conn)
            await self._check_devices(conn)
            if self.journal is not None:
                await self._check_journal(conn, self.journal)
            await self._check_outbox(conn, publish_timeout, streams=streams)

    async def _check_rows(self, conn: asyncpg.Connection) -> None:
        doubled = await conn.fetch(
            "SELECT task_id FROM attempts WHERE status = 'active' GROUP BY task_id HAVING count(*) > 1"
        )
        assert not doubled, f"tasks with two active attempts: {[str(r['task_id']) for r in doubled]}"
        tasks = {str(r["task_id"]): r for r in await conn.fetch("SELECT * FROM tasks")}
        lost = sorted(self.acknowledged - set(tasks))
        assert not lost, f"acknowledged tasks missing from the database: {lost}"
        numbers: dict[str, list[int]] = defaultdict(list)
        active: dict[str, list[int]] = defaultdict(list)
        for r in await conn.fetch("SELECT task_id, attempt, status FROM attempts ORDER BY task_id, attempt"):
            numbers[str(r["task_id"])].append(r["attempt"])
            if r["status"] == "active":
                active[str(r["task_id"])].append(r["attempt"])
        for task_id, t in tasks.items():
            status, count = t["status"], t["attempt_count"]
            assert status in TERMINAL | IN_FLIGHT | {"queued"}, f"task {task_id}: unknown status {status}"
            assert numbers[task_id] == list(range(1, count + 1)), (
                f"task {task_id}: attempts {numbers[task_id]} with attempt_count {count}"
            )
            assert count <= t["max_attempts"], f"task {task_id}: {count} attempts > max {t['max_attempts']}"
            if status in IN_FLIGHT:
                assert active[task_id] == [count], f"task {task_id} {status}: active attempts {active[task_id]}"
            else:
                assert not active[task_id], f"task {task_id} {status} with active attempts {active[task_id]}"

    async def _check_devices(self, conn: asyncpg.Connection) -> None:
        doubled = await conn.fetch(
            "SELECT device_id FROM attempts WHERE status = 'active' GROUP BY device_id HAVING count(*) > 1"
        )
        assert not doubled, f"devices with two active attempts: {[r['device_id'] for r in doubled]}"
        reserved = await conn.fetch(
            "SELECT device_id FROM reservations WHERE attempt_status = 'active' GROUP BY device_id HAVING count(*) > 1"
        )
        assert not reserved, f"devices with two active reservations: {[r['device_id'] for r in reserved]}"
        previous: dict[str, Any] = {}
        rows = await conn.fetch(
            "SELECT task_id, attempt, device_id, assigned_at, ended_at FROM attempts ORDER BY device_id, assigned_at"
        )
        for r in rows:
            before = previous.get(r["device_id"])
            if before is not None:
                ended = before["ended_at"]
                overlap = f"device {r['device_id']}: {r['task_id']}/{r['attempt']} assigned at {r['assigned_at']}"
                overlap += f" while {before['task_id']}/{before['attempt']} ran from {before['assigned_at']} to {ended}"
                assert ended is not None, overlap
                assert ended <= r["assigned_at"], overlap
            previous[r["device_id"]] = r

    async def _check_journal(self, conn: asyncpg.Connection, journal: StepJournal) -> None:
        overlaps = journal.overlaps()
        assert not overlaps, f"steps that ran while another attempt's step held the device: {overlaps}"
        expiry = {
            (str(r["task_id"]), r["attempt"]): r["expires_at"]
            for r in await conn.fetch("SELECT task_id, attempt, expires_at FROM attempts WHERE status = 'expired'")
        }
        runs = journal.runs()
        late = [
            (run.task_id, run.attempt, run.step, run.started, expiry[(run.task_id, run.attempt)])
            for run in runs
            if (run.task_id, run.attempt) in expiry and run.started > expiry[(run.task_id, run.attempt)] + slack()
        ]
        assert not late, f"steps of expired attempts started after the lease's expiry: {late}"
        spans: dict[str, list[tuple[datetime, datetime | None, tuple[str, int]]]] = defaultdict(list)
        by_attempt: dict[tuple[str, int], list[Any]] = defaultdict(list)
        for run in runs:
            by_attempt[(run.task_id, run.attempt)].append(run)
        for key, steps in by_attempt.items():
            first = min(s.started for s in steps)
            ends = [s.ended for s in steps]
            last = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
            spans[steps[0].device_id].append((first, last, key))
        for device_id, device_spans in spans.items():
            device_spans.sort(key=lambda s: s[0])
            for (_, end, key), (start, _, next_key) in itertools.pairwise(device_spans):
                if end is None:
                    continue  # killed mid-step: the lock check above covers it
                assert end <= start + slack(), f"device {device_id}: {key} ran until {end}, {next_key} began {start}"

    async def _check_outbox(self, conn: asyncpg.Connection, publish_timeout: float, *, streams: bool) -> None:
        async def all_sent() -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM outbox_unsent") == 0)

        await eventually(all_sent, timeout=publish_timeout, message="every outbox row published")
        if self.nc is None or not streams:
            return
        js = self.nc.jetstream()
        event_rows = await conn.fetchval("SELECT count(*) FROM outbox WHERE kind = 'task_event'")
        device_rows = await conn.fetchval("SELECT count(*) FROM outbox WHERE kind = 'device_event'")
        assignment_rows = await conn.fetchval("SELECT count(*) FROM outbox WHERE kind = 'assignment'")
        seqs = {str(r["task_id"]): r["event_seq"] for r in await conn.fetch("SELECT task_id, event_seq FROM tasks")}
        statuses = {str(r["task_id"]): r["status"] for r in await conn.fetch("SELECT task_id, status FROM tasks")}
        stored = [json.loads(m.data) for m in await stream_messages(js, stream_name(self.prefix, "EVENTS"))]
        events = [e for e in stored if "task_id" in e]  # the rest are device events (`P.events.device.<id>`)
        assert len(events) == event_rows, f"events stream holds {len(events)} task events for {event_rows} outbox rows"
        devices = len(stored) - len(events)
        assert devices == device_rows, f"events stream holds {devices} device events for {device_rows} outbox rows"
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in events:
            by_task[event["task_id"]].append(event)
        for task_id, seq in seqs.items():
            got = sorted(e["seq"] for e in by_task.get(task_id, []))
            assert got == list(range(1, seq + 1)), f"task {task_id}: event seqs {got}, expected 1..{seq}"
            ordered = sorted(by_task.get(task_id, []), key=lambda e: e["seq"])
            _check_terminal_events(task_id, ordered, statuses[task_id])
        info = await js.stream_info(stream_name(self.prefix, "ASSIGNMENTS"))
        acked, unacked = self.resends() if self.resends is not None else (0, 0)
        low, high = assignment_rows + acked, assignment_rows + acked + unacked
        assert low <= info.state.last_seq <= high, (
            f"assignments stream counted {info.state.last_seq} messages for {assignment_rows} assignment rows"
            f" and {acked} copies published again (+{unacked} unacknowledged)"
        )


def _check_terminal_events(task_id: str, ordered: Iterable[dict[str, Any]], status: str) -> None:
    """A task's terminal event is its only terminal event and its last, and it names the task's status."""
    events = list(ordered)
    terminal = [i for i, e in enumerate(events) if e.get("status") in TERMINAL]
    if status not in TERMINAL:
        assert not terminal, f"task {task_id} is {status} but its events ended it: {events}"
        return
    assert len(terminal) == 1, f"task {task_id}: {len(terminal)} terminal events: {events}"
    assert terminal[0] == len(events) - 1, f"task {task_id}: events after its terminal event: {events}"
    assert events[-1]["status"] == status, f"task {task_id} is {status}, its last event says {events[-1]['status']}"
