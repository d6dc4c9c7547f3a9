"""Store benchmarks (run on demand: `uv run pytest -m bench -s tests/bench/test_bench_store.py`).

Each figure is printed beside the raw Postgres rate measured in the same run: a single-row UPDATE by
primary key at the same concurrency, so the cost of the store's rules and bookkeeping is visible as a
ratio rather than an absolute number that depends on the machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from devsched.core.records import LeaseRef
from devsched.core.status import Outcome
from devsched.store import DeviceSpec, ManualClock, Store

pytestmark = pytest.mark.bench

WINDOW_S = 3.0
PLAN = '{"steps": [{"name": "s", "action": "noop", "args": {}}]}'


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _rate(concurrency: int, op: Callable[[int, int], Awaitable[object]]) -> float:
    """Operations per second of `op(worker, i)` run by `concurrency` workers for WINDOW_S."""
    deadline = time.perf_counter() + WINDOW_S
    counts = [0] * concurrency

    async def worker(w: int) -> None:
        while time.perf_counter() < deadline:
            await op(w, counts[w])
            counts[w] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return sum(counts) / (time.perf_counter() - start)


async def _raw_update_rate(dsn: str, concurrency: int) -> float:
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
    try:
        await pool.execute("CREATE TABLE IF NOT EXISTS bench_kv (id int PRIMARY KEY, v timestamptz)")
        await pool.execute("INSERT INTO bench_kv SELECT g, now() FROM generate_series(0, 255) g ON CONFLICT DO NOTHING")
        stmt = "UPDATE bench_kv SET v = now() + interval '30 seconds' WHERE id = $1"
        return await _rate(concurrency, lambda w, i: pool.execute(stmt, w))
    finally:
        await pool.close()


async def _seed(store: Store, *, hosts: int, devices_per_host: int, tasks: int) -> None:
    """Register hosts and devices through the store, and insert queued tasks in bulk (setup, not measured)."""
    for h in range(hosts):
        await store.register_host(f"h{h}", [DeviceSpec(f"h{h}-d{d}") for d in range(devices_per_host)])
    async with store.engine.begin() as conn:
        now = await store.clock.now(conn)
        await conn.execute(
            text(
                """
                INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at,
                                   updated_at, event_seq)
                SELECT gen_random_uuid(), 'queued', 0, 3, 30, CAST(:plan AS jsonb),
                       CAST(:now AS timestamptz) + g * interval '1 microsecond', :now, 1
                FROM generate_series(1, :n) g
                """
            ),
            {"plan": PLAN, "now": now, "n": tasks},
        )
        await conn.execute(text("ANALYZE"))


async def _heartbeats(store: Store, hosts: int) -> None:
    for h in range(hosts):
        await store.heartbeat(f"h{h}")


async def _truncate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE outbox, cancel_requests, attempts, tasks, devices, hosts CASCADE")
    finally:
        await conn.close()


def _line(what: str, value: float, unit: str, raw: float, raw_unit: str) -> str:
    return f"{what:<48} {value:>10.1f} {unit:<12} raw {raw:>9.1f} {raw_unit:<10} ratio {value / raw:6.3f}"


async def test_bench_store(database_url: str) -> None:
    dsn = _dsn(database_url)
    lines: list[str] = []

    # -- renewals at 1 and 16 concurrent sessions (database clock) ------------------------------
    store = Store.connect(database_url, pool_size=16, max_overflow=0)
    try:
        await _seed(store, hosts=4, devices_per_host=16, tasks=64)
        leases = [LeaseRef(m.host_id, m.task_id, m.attempt, m.lease_id) for m in await store.assign(limit=64)]
        for lease in leases:
            await store.claim(lease)
        for _ in range(50):  # warm-up
            await store.renew(leases[0])
        for concurrency in (1, 16):
            raw = await _raw_update_rate(dsn, concurrency)
            rate = await _rate(concurrency, lambda w, i: store.renew(leases[w]))
            lines.append(_line(f"renewals/s, {concurrency} session(s)", rate, "renew/s", raw, "update/s"))
    finally:
        await store.close()

    await _truncate(dsn)
    raw1 = await _raw_update_rate(dsn, 1)

    # -- assignments: 10,000 queued tasks over 1,000 devices ------------------------------------
    clock = ManualClock()
    store = Store.connect(database_url, clock=clock, pool_size=4)
    try:
        await _seed(store, hosts=10, devices_per_host=100, tasks=10_000)
        assigned, spent = 0, 0.0
        while assigned < 10_000:
            t0 = time.perf_counter()
            batch = []
            while True:
                got = await store.assign(limit=500)
                if not got:
                    break
                batch += got
            spent += time.perf_counter() - t0
            assigned += len(batch)
            if not batch:
                raise AssertionError("assignment stalled")
            for m in batch:  # release the devices for the next round (not measured)
                await store.report(LeaseRef(m.host_id, m.task_id, m.attempt, m.lease_id), Outcome.DONE)
            clock.advance(0.5)
            await _heartbeats(store, 10)
        lines.append(_line("assignments/s, 10k tasks over 1k devices", assigned / spent, "assign/s", raw1, "update/s"))
    finally:
        await store.close()

    await _truncate(dsn)

    # -- sweeping 10,000 expired leases ---------------------------------------------------------
    clock = ManualClock()
    store = Store.connect(database_url, clock=clock, pool_size=4)
    try:
        await _seed(store, hosts=10, devices_per_host=1000, tasks=10_000)
        total = 0
        while total < 10_000:
            total += len(await store.assign(limit=1000, device_limit=10_000))
        clock.advance(31)
        await _heartbeats(store, 10)
        t0 = time.perf_counter()
        swept = 0
        while batch_len := len(await store.sweep_expired(limit=500)):
            swept += batch_len
        elapsed = time.perf_counter() - t0
        assert swept == 10_000
        lines.append(_line("sweep 10k expired leases: leases/s", swept / elapsed, "lease/s", raw1, "update/s"))
        lines.append(f"{'sweep 10k expired leases: total time':<48} {elapsed:>10.2f} s")
    finally:
        await store.close()

    print("\n" + "\n".join(lines))
