"""What one no-op task's whole lifecycle costs, through the real services and a real agent.

    ./dev run python tests/bench/lifecycle_probe.py --concurrency 1 16 --tasks 300
    ./dev run python tests/bench/lifecycle_probe.py --durable            # Postgres on disk, fsync on
    ./dev run python tests/bench/lifecycle_probe.py --latency 50         # idle submit -> `done` latency

Starts its own nats-server and Postgres (from the pip packages, data in /dev/shm unless `--durable`), the
scheduler and the sweeper as processes (each as its own database role, production defaults otherwise) and
one `devsched-agent` with as many devices as the largest concurrency. For each concurrency `c` it keeps `c`
no-op tasks in flight (a new submit as each `done` event arrives) and reports, over a measured window after
a warm-up: tasks/s, database commits per task (`pg_stat_database.xact_commit`; read-only transactions count
too), CPU per task of every process (scheduler, sweeper, agent, Postgres, nats-server, this driver) and the
scheduler's RSS. `--latency N` submits N tasks one at a time on an otherwise idle system and reports the
time from the submit reply to the `done` event. `--statements` prints the top of pg_stat_statements.
`--queued N` first inserts N queued tasks that no device matches (the scheduler's cost with a deep queue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import nats
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devsched.embedded import NatsServer, PostgresServer
from devsched.embedded.postgres_server import FAST_SETTINGS
from devsched.store.migrations import upgrade
from support.databases import (
    as_service_role,
    build_template,
    create_test_database,
    ensure_test_roles,
    owner_url,
)
from support.scheduler_harness import ServiceProcess

DURABLE_SETTINGS = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on", "max_connections": "200"}
STEP = {"name": "noop", "action": "noop", "args": {}}


@contextmanager
def _dir(durable: bool, prefix: str) -> Iterator[Path]:
    parent = None if durable else "/dev/shm"
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env(database_url: str, nats_url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    env.update(
        DEVSCHED_DATABASE_URL=database_url,
        DEVSCHED_NATS_URL=nats_url,
        DEVSCHED_SUBJECT_PREFIX=prefix,
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


@dataclass
class Sample:
    """Counters read at one instant."""

    at: float
    commits: int
    cpu: dict[str, float]
    rss_mb: float


class Lab:
    """The servers, services and agent of one run."""

    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.prefix = f"p{uuid.uuid4().hex[:8]}"
        durable = args.durable
        base = stack.enter_context(_dir(durable, "devsched-probe-"))
        self.base = base
        self.nats = stack.enter_context(NatsServer(base / "nats"))
        settings = dict(DURABLE_SETTINGS if durable else FAST_SETTINGS)
        settings["shared_preload_libraries"] = "pg_stat_statements"
        (base / "pg").mkdir()
        self.pg = stack.enter_context(PostgresServer(base / "pg", settings=settings))
        admin = self.pg.dsn()
        ensure_test_roles(self.pg.url())
        template = build_template(admin, upgrade, self.pg.url)
        self.db = create_test_database(admin, template)
        self.url = self.pg.url(self.db)
        self.dsn = self.pg.dsn(self.db)
        upgrade(owner_url(self.url))  # as on a deployment: takes PUBLIC's CONNECT away again
        env = _env(self.url, self.nats.url, self.prefix, **{f"DEVSCHED_{k}": v for k, v in args.env})
        logs = base / "logs"
        logs.mkdir()
        self.logs = logs
        self.scheduler = ServiceProcess("devsched.scheduler", as_service_role(env, "scheduler"), logs / "sched.log")
        self.sweeper = ServiceProcess("devsched.sweeper", as_service_role(env, "sweeper"), logs / "sweeper.log")
        self.scheduler.start()
        self.sweeper.start()
        stack.callback(self.sweeper.ensure_stopped)
        stack.callback(self.scheduler.ensure_stopped)
        stack.callback(self._stop, self.sweeper)
        stack.callback(self._stop, self.scheduler)
        devices = max(args.concurrency)
        self.label = {"probe": self.prefix}
        agent_dir = base / "agent"
        agent_dir.mkdir()
        agent_dir.chmod(0o755)
        lines = [
            f'host_id = "{self.prefix}-h"',
            f"spool_dir = {json.dumps(str(agent_dir / 'spool'))}",
            f"work_dir = {json.dumps(str(agent_dir / 'work'))}",
            f'nats_url = "{self.nats.url}"',
            f'subject_prefix = "{self.prefix}"',
        ]
        for d in range(devices):
            lines += ["[[devices]]", f'device_id = "{self.prefix}-d{d}"', f'labels = {{ probe = "{self.prefix}" }}']
        (agent_dir / "agent.toml").write_text("\n".join(lines) + "\n")
        agent_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
        agent_env["PYTHONUNBUFFERED"] = "1"
        self.agent = ServiceProcess(
            "devsched.agent.main", agent_env, logs / "agent.log", "--config", str(agent_dir / "agent.toml")
        )
        self.stack.callback(self.agent.ensure_stopped)
        self.stack.callback(self._stop, self.agent)

    @staticmethod
    def _stop(process: ServiceProcess) -> None:
        try:
            process.terminate(timeout=20)
        except Exception as exc:
            print(f"{process.module} did not stop: {exc!r}", file=sys.stderr)

    async def ready(self) -> None:
        await self.scheduler.wait_logged("serving", timeout=60)
        await self.sweeper.wait_logged("sweeping", timeout=60)
        self.agent.start()
        await self.agent.wait_logged("bound to the assignments consumer", timeout=60)

    def processes(self) -> dict[str, list[psutil.Process]]:
        pg = psutil.Process(self.pg.pid) if self.pg.pid else None
        out = {
            "scheduler": [psutil.Process(self.scheduler.pid)],
            "sweeper": [psutil.Process(self.sweeper.pid)],
            "agent": [psutil.Process(self.agent.pid)],
            "nats": [psutil.Process(self.nats.pid)] if self.nats.pid else [],
            "postgres": [pg, *pg.children(recursive=True)] if pg else [],
            "driver": [psutil.Process()],
        }
        return out

    async def sample(self, conn: asyncpg.Connection) -> Sample:
        await asyncio.sleep(1.1)  # backends report their statistics at most once a second
        commits = await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.db)
        cpu: dict[str, float] = {}
        for name, procs in self.processes().items():
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            cpu[name] = total
        rss = psutil.Process(self.scheduler.pid).memory_info().rss / 2**20
        return Sample(time.perf_counter(), int(commits), cpu, rss)


class Driver:
    """Keeps `c` tasks in flight; knows when each submit was answered and when its `done` arrived."""

    def __init__(self, nc: Any, prefix: str, label: dict[str, str]) -> None:
        self.nc = nc
        self.prefix = prefix
        self.body = json.dumps({"selector": {"labels": label}, "plan": {"steps": [STEP]}}).encode()
        self.replied: dict[str, float] = {}
        self.done: dict[str, float] = {}
        #: Wall-clock times, to place the services' log lines between submit reply and `done`.
        self.wall: dict[str, tuple[float, float]] = {}
        self.waiters: dict[str, asyncio.Future[float]] = {}
        self.finished = asyncio.Queue[str]()

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.prefix}.events.task.*", cb=self._on_event)

    async def _on_event(self, msg: Any) -> None:
        event = json.loads(msg.data)
        if event["event"] in ("done", "failed", "cancelled"):
            task_id = event["task_id"]
            if task_id in self.done:
                return
            self.done[task_id] = time.perf_counter()
            self.wall[task_id] = (self.wall.get(task_id, (0.0, 0.0))[0], time.time())
            if event["event"] != "done":
                print("task ended", event, file=sys.stderr)
            self.finished.put_nowait(task_id)

    async def submit(self) -> str:
        reply = await self.nc.request(f"{self.prefix}.api.tasks.submit", self.body, timeout=30)
        if reply.headers and "Nats-Service-Error-Code" in reply.headers:
            raise RuntimeError(f"submit refused: {reply.headers} {reply.data!r}")
        task_id = str(json.loads(reply.data)["task_id"])
        self.replied[task_id] = time.perf_counter()
        self.wall[task_id] = (time.time(), 0.0)
        return task_id

    async def run(self, concurrency: int, total: int) -> None:
        """Submit `total` tasks keeping `concurrency` in flight; return when all are done."""
        submitted = 0
        ended = 0
        for _ in range(min(concurrency, total)):
            await self.submit()
            submitted += 1
        while ended < total:
            await asyncio.wait_for(self.finished.get(), timeout=60)
            ended += 1
            if submitted < total:
                await self.submit()
                submitted += 1


def _ms(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


async def measure(lab: Lab, args: argparse.Namespace) -> None:
    nc = await nats.connect(lab.nats.url)
    conn = await asyncpg.connect(lab.pg.dsn(lab.db))
    try:
        if args.statements:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        driver = Driver(nc, lab.prefix, lab.label)
        await driver.start()
        if args.queued:
            await _queue_unmatched(conn, args.queued)
            await asyncio.sleep(3)
        await driver.run(max(args.concurrency), max(args.concurrency) * 4)  # warm-up
        for c in args.concurrency:
            await driver.run(c, max(c * 3, 20))  # warm-up at this concurrency
            await asyncio.sleep(0.5)
            if args.statements:
                await conn.execute("SELECT pg_stat_statements_reset()")
            spy = _profile(lab, args, c)
            before = await lab.sample(conn)
            await driver.run(c, args.tasks)
            after = await lab.sample(conn)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
            seconds = after.at - before.at
            n = args.tasks
            cpu = {k: 1000 * (after.cpu[k] - before.cpu[k]) / n for k in after.cpu}
            total_cpu = sum(cpu.values())
            print(
                f"c={c:<3} tasks={n} {n / seconds:7.1f} tasks/s"
                f"  commits/task={(after.commits - before.commits) / n:5.2f}"
                f"  cpu/task={total_cpu:5.1f} ms ("
                + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                + f")  scheduler rss={after.rss_mb:.0f} MB",
                flush=True,
            )
            if args.statements:
                await _statements(conn, n)
        if args.latency:
            await asyncio.sleep(1.0)
            lat = []
            for _ in range(args.latency):
                task_id = await driver.submit()
                await asyncio.wait_for(_wait_done(driver, task_id), timeout=30)
                lat.append(driver.done[task_id] - driver.replied[task_id])
                await asyncio.sleep(0.25)
            print(
                f"latency submit-reply -> done, idle, n={len(lat)}: p50 {_ms(lat, 0.5):.1f} ms"
                f"  p90 {_ms(lat, 0.9):.1f} ms  min {1000 * min(lat):.1f} ms",
                flush=True,
            )
            _breakdown(lab, driver, list(driver.wall)[-len(lat) :])
    finally:
        await conn.close()
        await nc.close()


def _profile(lab: Lab, args: argparse.Namespace, c: int) -> subprocess.Popen[bytes] | None:
    """py-spy on the scheduler for the measured window (collapsed stacks, see `--profile`)."""
    if not args.profile:
        return None
    out = Path(args.profile) / f"scheduler-c{c}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [args.py_spy, "record", "--pid", str(lab.scheduler.pid), "--format", "raw", "--output", str(out)]
    argv += ["--rate", "250", "--nonblocking"]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return spy


#: Log lines that mark a task's way from the submit reply to its `done` event: (process, msg). Only INFO
#: lines: the agent's `step started` and `step ended` are DEBUG (its attempt's INFO lines frame them).
MILESTONES = [
    ("scheduler", "submitted"),
    ("scheduler", "assigned"),
    ("scheduler", "claimed"),
    ("agent", "attempt claimed"),
    ("agent", "attempt ended"),
    ("scheduler", "reported"),
    ("agent", "report recorded"),
]


def _breakdown(lab: Lab, driver: Driver, task_ids: list[str]) -> None:
    """Median time of each milestone after the submit reply (log lines carry wall-clock times)."""
    lines = {"scheduler": lab.scheduler.log_lines(), "agent": lab.agent.log_lines()}
    wanted = set(task_ids)
    seen: dict[tuple[str, str], list[float]] = {m: [] for m in MILESTONES}
    for process, logged in lines.items():
        for line in logged:
            key = (process, line.get("msg", ""))
            task_id = line.get("task_id") or (line.get("spool_key") or "").split(".")[0]
            if key in seen and task_id in wanted:
                ts = datetime.fromisoformat(line["ts"].replace("Z", "+00:00")).timestamp()
                seen[key].append(1000 * (ts - driver.wall[task_id][0]))
    handled: dict[str, list[float]] = {}
    start = min(driver.wall[t][0] for t in task_ids)
    for line in lines["scheduler"]:  # DEBUG lines "<endpoint> ok" with the handler's time (DEVSCHED_LOG_LEVEL)
        at = datetime.fromisoformat(line["ts"].replace("Z", "+00:00")).timestamp() if "ts" in line else 0.0
        if line.get("msg", "").endswith(" ok") and "ms" in line and at >= start:
            handled.setdefault(line["msg"][:-3], []).append(float(line["ms"]))
    for endpoint, values in sorted(handled.items()):
        print(f"   scheduler {endpoint + ' handled':24} p50 {statistics.median(values):6.1f} ms")
    done = [1000 * (driver.wall[t][1] - driver.wall[t][0]) for t in task_ids]
    for (process, msg), values in seen.items():
        if values:
            print(f"   {process:9} {msg!r:24} p50 {statistics.median(values):6.1f} ms after the submit reply")
    print(f"   {'driver':9} {'done event':24} p50 {statistics.median(done):6.1f} ms")


async def _wait_done(driver: Driver, task_id: str) -> None:
    while task_id not in driver.done:
        await driver.finished.get()


async def _queue_unmatched(conn: asyncpg.Connection, n: int) -> None:
    """N queued tasks that no device matches, each with a selector of its own (the worst case for DISTINCT)."""
    await conn.execute(
        """
        INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, selector_labels,
                           created_at, updated_at, event_seq)
        SELECT gen_random_uuid(), 'queued', 0, 3, 30, '{"steps": [{"name": "s", "action": "noop", "args": {}}]}',
               jsonb_build_object('nowhere', g::text), now(), now(), 1
        FROM generate_series(1, $1) g
        """,
        n,
    )
    await conn.execute("ANALYZE")


async def _statements(conn: asyncpg.Connection, n: int) -> None:
    rows = await conn.fetch(
        "SELECT calls, total_exec_time, query FROM pg_stat_statements WHERE dbid = "
        "(SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC LIMIT 25"
    )
    for r in rows:
        q = " ".join(r["query"].split())[:110]
        print(f"   {r['calls'] / n:6.2f}/task {r['total_exec_time'] / n:6.3f} ms/task  {q}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tasks", type=int, default=300, help="measured tasks per concurrency")
    parser.add_argument("--durable", action="store_true", help="Postgres data on disk with fsync on")
    parser.add_argument("--latency", type=int, default=0, help="idle single-task latency samples")
    parser.add_argument("--statements", action="store_true", help="print pg_stat_statements per task")
    parser.add_argument("--queued", type=int, default=0, help="unmatched queued tasks inserted first")
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of the scheduler")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--hold", type=float, default=0, help="seconds to keep everything up at the end")
    parser.add_argument(
        "--env", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help="DEVSCHED_NAME=VALUE"
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        lab = Lab(args, stack)

        async def go() -> None:
            await lab.ready()
            where = "durable (disk, fsync on)" if args.durable else "in /dev/shm, fsync off"
            print(f"scheduler pid {lab.scheduler.pid}, postgres {where}", flush=True)
            await measure(lab, args)
            if args.hold:
                await asyncio.sleep(args.hold)

        asyncio.run(go())


if __name__ == "__main__":
    main()
