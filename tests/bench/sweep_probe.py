"""What sweeping expired leases costs, beside a raw batched UPDATE of the same rows, and what it does to renewals.

    ./dev run python tests/bench/sweep_probe.py                  # 10,000 expired leases, Postgres in /dev/shm
    ./dev run python tests/bench/sweep_probe.py --durable        # Postgres on disk, fsync on

Seeds 10,000 expired attempts (and 16 live leases) through the store, then:

1. the raw baseline: `WITH c AS (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 500) UPDATE attempts ...` in
   batches until none is left; then the rows are put back and the tables vacuumed;
2. the sweep, as `devsched-sweeper` does it (`Sweeper.sweep`, batches of `--batch`, its log lines written
   to a file as in production), timed;
3. meanwhile a separate process renews the live leases through the store (4 at a time) and records each
   renewal's latency: p99 before the sweep (idle) against p99 during it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

import asyncpg
import psutil
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devsched.core.records import LeaseRef
from devsched.embedded import PostgresServer
from devsched.embedded.postgres_server import FAST_SETTINGS
from devsched.service import bind, configure_logging
from devsched.store import DeviceSpec, Store
from devsched.store.migrations import upgrade
from devsched.sweeper.app import Sweeper, SweeperSettings
from support.databases import build_template, create_test_database, ensure_test_roles, owner_url, service_url
from support.outbox_rows import ALL_PUBLISHED

DURABLE_SETTINGS = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on", "max_connections": "200"}
PLAN = '{"steps": [{"name": "s", "action": "noop", "args": {}}]}'

RAW = """
WITH c AS (
    SELECT a.task_id, a.attempt FROM attempts a
    WHERE a.status = 'active' AND a.expires_at <= clock_timestamp()
    ORDER BY a.expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE attempts a SET status = 'expired', end_reason = 'lease_expired', ended_at = clock_timestamp()
FROM c WHERE a.task_id = c.task_id AND a.attempt = c.attempt
"""
RESET = [
    "UPDATE attempts SET status = 'active', end_reason = NULL, ended_at = NULL WHERE status = 'expired'",
    "UPDATE tasks SET status = 'assigned', reason = NULL, event_seq = 2 WHERE lease_ttl_s = 1",
    "UPDATE devices SET available_after = NULL WHERE available_after IS NOT NULL",
    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox_unsent)",
    "VACUUM ANALYZE",
]

#: The renewing process: renews the leases given as JSON on stdin for `seconds`, prints (time, latency) pairs.
RENEWER = """
import asyncio, json, sys, time, uuid
from devsched.core.records import LeaseRef
from devsched.store import Store

async def main(url, leases, stop, workers):
    import os
    store = Store.connect(url, pool_size=workers, max_overflow=0)
    samples = []
    async def work(w):
        mine = leases[w::workers]
        i = 0
        while not os.path.exists(stop):
            host, task, lease = mine[i % len(mine)]
            ref = LeaseRef(host, uuid.UUID(task), 1, uuid.UUID(lease))
            t0 = time.perf_counter()
            await store.renew(ref)
            samples.append((time.time(), time.perf_counter() - t0))
            i += 1
            await asyncio.sleep(0.005)
    await asyncio.gather(*(work(w) for w in range(workers)))
    await store.close()
    print(json.dumps(samples))

args = json.loads(sys.stdin.read())
asyncio.run(main(args["url"], args["leases"], args["stop"], args["workers"]))
"""


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def seed(url: str, expired: int, live: int) -> list[tuple[str, str, str]]:
    """`expired` attempts whose 1 s leases run out, and `live` claimed ones with an hour's lease."""
    store = Store.connect(url, pool_size=4)
    try:
        hosts = 10
        per_host = (expired + live) // hosts + 1
        for h in range(hosts):
            await store.register_host(f"h{h}", [DeviceSpec(f"h{h}-d{d}") for d in range(per_host)])
        async with store.engine.begin() as conn:
            for n, ttl in ((live, 3600), (expired, 1)):
                await conn.execute(
                    text(
                        """
                        INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at,
                                           updated_at, event_seq)
                        SELECT gen_random_uuid(), 'queued', CAST(:priority AS int), 3, CAST(:ttl AS int),
                               CAST(:plan AS jsonb), clock_timestamp(), clock_timestamp(), 1
                        FROM generate_series(1, :n)
                        """
                    ),
                    {"plan": PLAN, "n": n, "ttl": ttl, "priority": 1 if ttl > 1 else 0},
                )
        leases: list[tuple[str, str, str]] = []
        assigned = 0
        while assigned < expired + live:
            got = await store.assign(limit=2000, device_limit=expired + live + hosts)
            if not got:
                raise AssertionError("seeding stalled")
            for m in got:
                if m.ttl_s > 1:
                    leases.append((m.host_id, str(m.task_id), str(m.lease_id)))
            assigned += len(got)
        for host_id, task_id, lease_id in leases:
            import uuid

            await store.claim(LeaseRef(host_id, uuid.UUID(task_id), 1, uuid.UUID(lease_id)))
        async with store.engine.begin() as conn:
            await conn.execute(text(ALL_PUBLISHED))
        await asyncio.sleep(1.5)  # the short leases run out
        return leases
    finally:
        await store.close()


async def reset(dsn: str) -> None:
    """Put every expired lease back as it was before the sweep (or the raw update), and vacuum."""
    conn = await asyncpg.connect(dsn)
    try:
        for statement in RESET:
            await conn.execute(statement)
    finally:
        await conn.close()


async def raw(dsn: str, batch: int) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        while True:
            status = await conn.execute(RAW, batch)
            if status.endswith(" 0"):
                break
        return time.perf_counter() - t0
    finally:
        await conn.close()


def database(pg: PostgresServer) -> str:
    """A migrated database of its own; its name."""
    admin = pg.dsn()
    ensure_test_roles(pg.url())
    template = build_template(admin, upgrade, pg.url)
    db = create_test_database(admin, template)
    upgrade(owner_url(pg.url(db)))
    return db


async def run(args: argparse.Namespace, pg: PostgresServer, db: str, work: Path) -> None:
    url = pg.url(db)
    leases = await seed(url, args.expired, args.live)
    dsn = pg.dsn(db)
    await reset(dsn)
    log_file = (work / "sweeper.log").open("a")
    configure_logging("INFO", stream=log_file, service="devsched-sweeper")
    settings = SweeperSettings(
        database_url=service_url(url, "sweeper"), subject_prefix="bench", sweep_batch=args.batch, device_grace_s=0.0
    )

    async def sweep() -> None:
        sweeper = Sweeper(settings)
        sweeper._store = Store.connect(settings.database_url, pool_size=3, max_overflow=1, device_grace_s=0.0)
        try:
            assert await sweeper.sweep() == args.expired
        finally:
            await sweeper._store.close()

    async def sequential() -> None:
        """The sweep as it was: log a batch, then start the next."""
        store = Store.connect(settings.database_url, pool_size=2, max_overflow=1, device_grace_s=0.0)
        log = logging.getLogger("devsched.sweeper")
        try:
            while True:
                expired = await store.sweep_expired(limit=args.batch)
                for lease in expired:
                    with bind(task_id=lease.task_id, attempt=lease.attempt, lease_id=lease.lease_id):
                        log.info("lease expired", extra={"device_id": lease.device_id, "reason": lease.reason})
                if len(expired) < args.batch:
                    return
        finally:
            await store.close()

    if args.sequential:
        sweep = sequential

    # 1. cost: wall time and CPU (Postgres and this process), nothing else running
    costs: list[str] = []
    for _ in range(args.rounds):
        raw_wall, raw_cpu = await _timed(pg, lambda: raw(dsn, args.batch))
        await reset(dsn)
        own = time.process_time()
        sweep_wall, sweep_cpu = await _timed(pg, sweep)
        own = time.process_time() - own
        await reset(dsn)
        costs.append(
            f"wall {sweep_wall:.2f}/{raw_wall:.2f} s = {sweep_wall / raw_wall:.2f}x,"
            f" cpu {sweep_cpu:.2f}/{raw_cpu:.2f} s = {sweep_cpu / raw_cpu:.2f}x (of which the sweeper's {own:.2f} s)"
        )

    # 2. renewals (another process) while idle and while sweeping
    stop = work / "stop"
    renewer = subprocess.Popen(  # noqa: ASYNC220 - started once, read at the end
        [sys.executable, "-c", RENEWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert renewer.stdin is not None
    assert renewer.stdout is not None
    renew_url = service_url(url, "scheduler")
    renewer.stdin.write(json.dumps({"url": renew_url, "leases": leases, "stop": str(stop), "workers": 4}))
    renewer.stdin.close()
    idle_windows: list[tuple[float, float]] = []
    sweep_windows: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        t = time.time()
        await asyncio.sleep(args.idle_s)
        idle_windows.append((t, time.time()))
        t = time.time()
        await sweep()
        sweep_windows.append((t, time.time()))
        await reset(dsn)
    stop.touch()
    samples = json.loads(await asyncio.to_thread(renewer.stdout.read))
    renewer.wait(10)
    log_file.close()

    def within(windows: list[tuple[float, float]]) -> list[float]:
        return [lat for at, lat in samples if any(a <= at <= b for a, b in windows)]

    idle, during = within(idle_windows), within(sweep_windows)
    where = "durable (disk, fsync on)" if args.durable else "in /dev/shm, fsync off"
    print(f"postgres {where}; {args.expired} expired leases, batches of {args.batch}", file=sys.stderr)
    print("sweep against a raw batched UPDATE ... SKIP LOCKED, per round:", file=sys.stderr)
    for line in costs:
        print(f"   {line}", file=sys.stderr)
    print(
        f"renewal p50/p99 idle {_p(idle, 0.5):.1f}/{_p(idle, 0.99):.1f} ms (n={len(idle)})   during the sweeps "
        f"{_p(during, 0.5):.1f}/{_p(during, 0.99):.1f} ms (n={len(during)})   p99 ratio "
        f"{_p(during, 0.99) / _p(idle, 0.99):.2f}",
        file=sys.stderr,
    )


async def _timed(pg: PostgresServer, work: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall time of `work`, and the CPU time Postgres and this process spent meanwhile."""

    def cpu() -> float:
        assert pg.pid is not None
        server = psutil.Process(pg.pid)
        t = server.cpu_times()  # backends that exited count in the postmaster's children times
        total = t.user + t.system + t.children_user + t.children_system
        for p in [*server.children(), psutil.Process()]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    c0, t0 = cpu(), time.perf_counter()
    await work()
    return time.perf_counter() - t0, cpu() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expired", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=16)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--sequential", action="store_true", help="the sweep without pipelining (as before)")
    args = parser.parse_args()
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="devsched-sweep-", dir=None if args.durable else "/dev/shm"))
        work.chmod(0o755)
        (work / "pg").mkdir()
        pg = stack.enter_context(
            PostgresServer(work / "pg", settings=DURABLE_SETTINGS if args.durable else FAST_SETTINGS)
        )
        try:
            asyncio.run(run(args, pg, database(pg), work))
        finally:
            stack.callback(lambda: subprocess.run(["rm", "-rf", str(work)], check=False))


if __name__ == "__main__":
    main()
