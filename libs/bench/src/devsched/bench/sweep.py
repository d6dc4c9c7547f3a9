"""The sweep figures: N expired leases ended by the real sweeper, beside a floor that writes the same rows.

N tasks (one submitted, the rest copies of it: seeding.py) with 1 s leases and one attempt each are
assigned by the real scheduler to protocol-speaking hosts that never claim them, while the sweeper
process is paused (SIGSTOP), so that all N leases are expired when it resumes (SIGCONT): its next pass
ends them all, batch after batch, and it then publishes `P.internal.wake` with how many it released. The
floor copies the same attempt, task and device rows into tables of their own and ends the leases with
one statement per batch of the sweeper's size, each its own transaction, writing the four rows the sweep
writes per lease (the attempt ended, the task failed, the device's grace, the event inserted).

Then the same again while the 64 renewal requesters run: their p99 while the sweeper works (from its
resume to its wake-up), beside their p99 just before, idle. The N `failed` events the scheduler publishes
next are waited for after the load, so that the next phase does not start under that backlog.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from typing import Any

from nats.aio.msg import Msg

from devsched.bench.context import NOOP_PLAN, Context, Watch
from devsched.bench.figures import Figure, at_most
from devsched.bench.hosts import BenchHost
from devsched.bench.load import Load
from devsched.bench.options import REQUESTERS
from devsched.bench.probes import Distribution
from devsched.bench.renewals import Rig
from devsched.bench.seeding import copy_task
from devsched.bench.servers import DATABASE, PREFIX
from devsched.protocol.codec import decode, encode
from devsched.protocol.wake import Wake

#: Hosts that hold the leases.
HOSTS = 10
#: The sweeper's default batch (`DEVSCHED_SWEEP_BATCH`): the floor's batch too.
BATCH = 500
#: The lease of the swept tasks, in seconds (the shortest a task may ask for).
TTL_S = 1

#: The floor: the same attempt, task and device rows, in tables of their own, and an event table like the
#: outbox; it writes the four rows the sweep writes per lease (attempt ended, task failed, device's grace,
#: event inserted), set-based, with none of the product's logic.
_FLOOR_SETUP = (
    "CREATE TABLE bench_floor_attempts (LIKE attempts)",
    "INSERT INTO bench_floor_attempts SELECT * FROM attempts WHERE status = 'active' AND task_id = ANY($1::uuid[])",
    "ALTER TABLE bench_floor_attempts ADD PRIMARY KEY (task_id, attempt)",
    "CREATE INDEX ON bench_floor_attempts (expires_at) WHERE status = 'active'",
    "CREATE TABLE bench_floor_tasks (LIKE tasks)",
    "INSERT INTO bench_floor_tasks SELECT * FROM tasks WHERE task_id = ANY($1::uuid[])",
    "ALTER TABLE bench_floor_tasks ADD PRIMARY KEY (task_id)",
    "CREATE TABLE bench_floor_devices (LIKE devices)",
    "INSERT INTO bench_floor_devices SELECT * FROM devices WHERE device_id IN"
    " (SELECT device_id FROM bench_floor_attempts)",
    "ALTER TABLE bench_floor_devices ADD PRIMARY KEY (device_id)",
    "CREATE TABLE bench_floor_events (LIKE outbox INCLUDING DEFAULTS INCLUDING IDENTITY)",
    "ALTER TABLE bench_floor_events ADD PRIMARY KEY (id)",
)
_FLOOR_TABLES = ("bench_floor_attempts", "bench_floor_tasks", "bench_floor_devices", "bench_floor_events")
_FLOOR_SWEEP = f"""
WITH picked AS (
    SELECT task_id, attempt FROM bench_floor_attempts
    WHERE status = 'active' AND expires_at <= now()
    LIMIT {BATCH}
    FOR UPDATE SKIP LOCKED
),
ended AS (
    UPDATE bench_floor_attempts f SET status = 'expired', end_reason = 'lease_expired', ended_at = now()
    FROM picked WHERE f.task_id = picked.task_id AND f.attempt = picked.attempt
    RETURNING f.task_id, f.attempt, f.host_id, f.device_id
),
failed AS (
    UPDATE bench_floor_tasks t SET status = 'failed', reason = 'lease_expired', updated_at = now(),
                                   event_seq = t.event_seq + 1
    FROM ended WHERE t.task_id = ended.task_id
    RETURNING t.task_id, t.event_seq
),
grace AS (
    UPDATE bench_floor_devices d SET available_after = now() + interval '5 seconds'
    FROM ended WHERE d.device_id = ended.device_id
),
event AS (
    INSERT INTO bench_floor_events (kind, data, created_at)
    SELECT 'task_event',
           jsonb_build_object('event', 'failed', 'task_id', e.task_id, 'seq', f.event_seq, 'status', 'failed',
                              'at', now(), 'attempt', e.attempt, 'host_id', e.host_id, 'device_id', e.device_id,
                              'reason', 'lease_expired'),
           now()
    FROM ended e JOIN failed f ON f.task_id = e.task_id
)
SELECT count(*) FROM ended
"""


class Sweeps:
    """The hosts of the swept leases and the sweeper's wake-ups."""

    def __init__(self, ctx: Context, leases: int) -> None:
        self.ctx = ctx
        self.leases = leases
        self.labels = {"bench": "sweep"}
        self.hosts: list[BenchHost] = []
        self.released: asyncio.Queue[int] = asyncio.Queue()
        self.resumed_at = 0.0

    @property
    def sweeper_pid(self) -> int:
        """The sweeper process."""
        pid = self.ctx.stack.pids()["sweeper"]
        assert pid is not None
        return pid

    async def start(self) -> None:
        """Listen for the sweeper's wake-ups."""

        async def on_wake(msg: Msg) -> None:
            self.released.put_nowait(decode(Wake, msg.data).released)

        await self.ctx.nc.subscribe(self.ctx.subjects.internal_wake, cb=on_wake)
        await self.ctx.nc.flush()

    async def expired_leases(self) -> list[str]:
        """Pause the sweeper; have N tasks assigned to the hosts and their leases expire; returns their ids."""
        ctx, n = self.ctx, self.leases
        os.kill(self.sweeper_pid, signal.SIGSTOP)
        # watching from before the submit: with the hosts there, the template is assigned at once
        watch = ctx.events.watch(until=lambda e: e.get("event") == "assigned")
        try:
            template = await ctx.client.submit(NOOP_PLAN, selector=self.labels, lease_ttl_s=TTL_S, max_attempts=1)
            ids = [str(template.task_id)]
            watch.add(ids)
            copies = await copy_task(ctx.stack.admin_dsn(DATABASE), ids[0], n - 1)
            watch.add(copies)
            ids += copies
            if not self.hosts:
                await self._register()
            else:  # the hosts are there: wake the assignment loop for the copies
                await ctx.nc.publish(ctx.subjects.internal_wake, encode(Wake(released=0)))
            await watch.wait(60 + n / 50, "sweep: assignments")
        finally:
            ctx.events.forget(watch)
        last = max(arrived["assigned"] for arrived in (watch.arrived[i] for i in ids))
        await asyncio.sleep(max(0.0, last + TTL_S + 1.0 - time.perf_counter()))
        return ids

    async def _register(self) -> None:
        per_host = math.ceil(self.leases / HOSTS)
        for h in range(HOSTS):
            host = BenchHost(self.ctx.stack.nats_url, PREFIX, f"bench-s{h}")
            await host.connect()
            interval = await host.register([(f"bench-s{h}-d{d}", self.labels) for d in range(per_host)])
            host.start_heartbeats(interval)
            self.hosts.append(host)

    async def resume(self, ids: list[str]) -> tuple[float, dict[str, float], Watch]:
        """Resume the sweeper; returns (seconds until it said all are swept, CPU, the watch of their events)."""
        ctx = self.ctx
        watch = ctx.events.watch(ids)
        meter = ctx.meter("sweeper", "postgres")
        meter.start()
        self.resumed_at = time.perf_counter()
        os.kill(self.sweeper_pid, signal.SIGCONT)
        released = 0
        while released < len(ids):
            released += await asyncio.wait_for(self.released.get(), 60 + len(ids) / 50)
        return time.perf_counter() - self.resumed_at, meter.stop(), watch

    async def published(self, watch: Watch) -> float:
        """Wait until every swept task's end event has arrived; returns the seconds since the resume."""
        try:
            await watch.wait(120 + len(watch.pending) / 20, "sweep: events")
        finally:
            self.ctx.events.forget(watch)
        return time.perf_counter() - self.resumed_at

    async def close(self) -> None:
        """Take the hosts' devices out (re-register with none), then close them."""
        for host in self.hosts:
            await host.register([])
            await host.close()


async def floor_sweep(ctx: Context, ids: list[str]) -> tuple[float, dict[str, float]]:
    """End the same expired leases writing the sweep's four rows each, set-based; returns (seconds, CPU)."""
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(ctx.stack.admin_dsn(DATABASE), timeout=15)
    try:
        for statement in _FLOOR_SETUP:
            await (conn.execute(statement, ids) if "$1" in statement else conn.execute(statement))
        await conn.execute(f"ANALYZE {', '.join(_FLOOR_TABLES)}")
        meter = ctx.meter("postgres")
        meter.start()
        started = time.perf_counter()
        while await conn.fetchval(_FLOOR_SWEEP):
            pass
        seconds = time.perf_counter() - started
        cpu = meter.stop()
        ended = await conn.fetchval("SELECT count(*) FROM bench_floor_events")
        if ended != len(ids):
            raise RuntimeError(f"the sweep floor ended {ended} leases of {len(ids)}")
        await conn.execute(f"DROP TABLE {', '.join(_FLOOR_TABLES)}")
    finally:
        await conn.close()
    return seconds, cpu


async def sweep_phase(ctx: Context, rig: Rig) -> None:
    """Adds the sweep figures."""
    n = ctx.sizes.leases
    sweeps = Sweeps(ctx, n)
    await sweeps.start()
    ctx.say(f"sweep: {n} expired leases, the real sweeper beside a floor writing the same four rows per lease")
    try:
        ids = await sweeps.expired_leases()
        floor_s, floor_cpu = await floor_sweep(ctx, ids)
        await ctx.pg.reset_statements()
        swept_s, cpu, watch = await sweeps.resume(ids)
        # every process's SQL while the sweeper worked: its own, and the scheduler's relaying its events
        ctx.sql_profiles["sweep"] = (await ctx.pg.statements(DATABASE), n, "lease")
        published_s = await sweeps.published(watch)
        ctx.say(f"  sweeper {swept_s:.2f} s (events out after {published_s:.2f} s), floor {floor_s:.2f} s")

        ctx.say(f"sweep: again, with the {REQUESTERS} renewal requesters running")
        ids = await sweeps.expired_leases()
        load = Load(rig.renew, REQUESTERS)
        load.start()
        try:
            await asyncio.sleep(ctx.sizes.warmup_s)
            idle_from = time.perf_counter()
            await asyncio.sleep(ctx.sizes.window_s)
            idle_to = time.perf_counter()
            await ctx.pg.reset_statements()
            loaded_s, _, watch = await sweeps.resume(ids)
            ctx.sql_profiles["sweep, renewals running"] = (await ctx.pg.statements(DATABASE), n, "lease")
            during_to = time.perf_counter()
        finally:
            await load.stop()
        # the scheduler publishes the N end events after the sweep: not part of the window, but the next
        # phase must not start under that backlog
        loaded_published_s = await sweeps.published(watch)
        idle = Distribution.of(load.samples(idle_from, idle_to))
        during = Distribution.of(load.samples(idle_to, during_to))
    finally:
        os.kill(sweeps.sweeper_pid, signal.SIGCONT)  # never leave it paused
        await sweeps.close()
    ctx.samples["renewals, idle"] = load.samples(idle_from, idle_to)
    ctx.samples["renewals, during a sweep"] = load.samples(idle_to, during_to)
    ctx.say(f"  renewal p99 idle {idle.p99_ms:.2f} ms, during the sweep {during.p99_ms:.2f} ms")
    per_lease = {k: round(1000 * v / n, 4) for k, v in cpu.items()}
    details: dict[str, Any] = {
        "leases": n,
        "batch": BATCH,
        "sweeper_s": round(swept_s, 4),
        "events_published_s": round(published_s, 4),
        "cpu_ms_per_lease": per_lease,
        "floor_s": round(floor_s, 4),
        "floor_cpu_ms_per_lease": {k: round(1000 * v / n, 4) for k, v in floor_cpu.items()},
        "under_load": {
            "sweeper_s": round(loaded_s, 4),
            "events_published_s_renewals_stopped_at_sweep_end": round(loaded_published_s, 4),
            "renewals_idle": idle.as_dict(),
            "renewals_during": during.as_dict(),
        },
    }
    ctx.details["sweep"] = details
    floor_name = f"floor: the four rows per lease, UPDATE ... SKIP LOCKED in batches of {BATCH}"
    ctx.figures += [
        Figure("sweep.seconds", f"sweep of {n} expired leases", "s", swept_s, floor_s, floor_name, at_most(2.0)),
        Figure("sweep.cpu_ms_per_lease", "CPU ms/lease (sweeper+Postgres)", "ms", 1000 * sum(cpu.values()) / n,
               1000 * sum(floor_cpu.values()) / n, f"{floor_name} (Postgres)"),
        Figure("sweep.renewal_p99_ms", "renewal p99 during the sweep", "ms", during.p99_ms, idle.p99_ms,
               "the same renewals, idle", at_most(2.0),
               note=f"{during.count} renewals while the sweeper worked ({loaded_s:.2f} s)"),
    ]  # fmt: skip
