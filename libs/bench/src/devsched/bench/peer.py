"""The peer: Procrastinate 3 (PsycopgConnector) on the same Postgres, in a database of its own.

Measured like devsched's lifecycle: N no-op jobs deferred one by one from this process (the defer rate),
then one worker process at concurrency c, started and connected first, runs until the queue is empty
(`run_worker_async(wait=False)`). Its pool may hold 20 connections, as many as the scheduler's (10 plus
10 overflow). Procrastinate, psycopg and their versions come from the optional `bench` group; without
them `available()` says so and the lifecycle figures stand alone.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from devsched.bench.pgstats import Counted, PgStats, since
from devsched.bench.probes import CpuMeter
from devsched.embedded.supervisor import popen

#: The peer's queue and task name.
QUEUE = "bench"
TASK = "bench_noop"
#: Connections of the worker's pool (the scheduler's pool_size + max_overflow).
WORKER_POOL = 20


def version() -> str | None:
    """Procrastinate's version, or None when it (or psycopg) is not installed."""
    try:
        importlib.metadata.version("psycopg")
        return importlib.metadata.version("procrastinate")
    except importlib.metadata.PackageNotFoundError:
        return None


def make_app(dsn: str, *, min_size: int, max_size: int) -> Any:
    """A Procrastinate app on `dsn` with the no-op task (`app.tasks[TASK]`)."""
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=min_size, max_size=max_size)
    )

    @app.task(name=TASK, queue=QUEUE)
    async def noop() -> None:
        return None

    return app


@dataclass
class PeerRun:
    """One Procrastinate run at one concurrency."""

    concurrency: int
    jobs: int
    defer_s: float
    defer_cpu_s: dict[str, float]
    defer_counted: Counted
    run_s: float
    run_cpu_s: dict[str, float]
    run_counted: Counted

    @property
    def defer_rate(self) -> float:
        """Jobs deferred per second, one by one."""
        return self.jobs / self.defer_s

    @property
    def jobs_per_s(self) -> float:
        """Jobs run per second by the worker."""
        return self.jobs / self.run_s

    def whole(self) -> Counted:
        """What deferring and running the jobs cost the database together."""
        return self.defer_counted.plus(self.run_counted)

    def cpu_ms_per_job(self) -> float:
        """CPU ms per job of the worker and Postgres."""
        return 1000 * sum(self.run_cpu_s.values()) / self.jobs

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output."""
        return {
            "concurrency": self.concurrency,
            "jobs": self.jobs,
            "defer_s": round(self.defer_s, 4),
            "defer_per_s": round(self.defer_rate, 1),
            "defer_cpu_s": {k: round(v, 4) for k, v in self.defer_cpu_s.items()},
            "defer_commits_per_job": round(self.defer_counted.commits / self.jobs, 3),
            "run_s": round(self.run_s, 4),
            "jobs_per_s": round(self.jobs_per_s, 1),
            "run_cpu_s": {k: round(v, 4) for k, v in self.run_cpu_s.items()},
            "cpu_ms_per_job": round(self.cpu_ms_per_job(), 4),
            "commits_per_job": round(self.run_counted.commits / self.jobs, 3),
            "wal_bytes_per_job": round(self.run_counted.wal_bytes / self.jobs),
            "row_versions_per_job": round(self.whole().row_versions / self.jobs, 3),
            "write_transactions_per_job": round(self.run_counted.write_transactions / self.jobs, 3),
        }


class Peer:
    """Procrastinate in `database` of the bench's Postgres (its schema applied by `prepare`)."""

    def __init__(self, dsn: str, database: str, pg: PgStats, postgres_pid: int | None) -> None:
        self.dsn = dsn
        self.database = database
        self.pg = pg
        self.postgres_pid = postgres_pid

    async def prepare(self) -> None:
        """Apply Procrastinate's schema (a fresh database)."""
        app = make_app(self.dsn, min_size=1, max_size=2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def run(self, jobs: int, concurrency: int) -> PeerRun:
        """Defer `jobs` no-op jobs one by one, then run them with one worker at `concurrency`."""
        before = await self.pg.counters(self.database)
        app = make_app(self.dsn, min_size=1, max_size=4)
        meter = CpuMeter({"postgres": self.postgres_pid})
        async with app.open_async():
            task = app.tasks[TASK]
            meter.start()
            started, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(jobs):
                await task.defer_async()
            defer_s = time.perf_counter() - started
            defer_cpu = {**meter.stop(), "client (bench process)": time.process_time() - cpu0}
        # the pool is closed: its backends reported their counts as they exited
        mid = await self._counters_after_exit()
        defer_counted = since(before, mid)

        worker = WorkerProcess(self.dsn, concurrency)
        await worker.start()
        try:
            meter = CpuMeter({"worker": worker.pid, "postgres": self.postgres_pid})
            meter.start()
            started = time.perf_counter()
            await worker.go(timeout=120 + jobs * 0.2)
            run_s = time.perf_counter() - started
            run_cpu = meter.stop()
        finally:
            await worker.stop()
        after = await self._counters_after_exit()
        run_counted = since(mid, after)
        return PeerRun(concurrency, jobs, defer_s, defer_cpu, defer_counted, run_s, run_cpu, run_counted)

    async def _counters_after_exit(self) -> Any:
        await asyncio.sleep(0.5)  # a backend reports its counts when it notices its client left
        return await self.pg.counters(self.database)


class WorkerProcess:
    """`python -m devsched.bench.peer_worker`: connects, says `ready`; on `go` works, says `done`."""

    def __init__(self, dsn: str, concurrency: int) -> None:
        self.argv = [
            sys.executable, "-m", "devsched.bench.peer_worker", dsn, str(concurrency), str(WORKER_POOL),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int | None:
        """Its pid while it runs."""
        return None if self.proc is None else self.proc.pid

    async def _line(self, timeout: float) -> str:  # noqa: ASYNC109
        assert self.proc is not None
        assert self.proc.stdout is not None
        try:
            return (await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)).strip()
        except TimeoutError:
            return ""

    async def start(self) -> None:
        """Start it; returns once its pool is open.

        Raises:
            RuntimeError: it did not get ready.
        """
        self._spawn()
        if (said := await self._line(60)) != "ready":
            await self.stop()
            raise RuntimeError(f"the Procrastinate worker did not start (said {said!r})")

    def _spawn(self) -> None:
        self.proc = popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            death_signal=signal.SIGTERM,
        )

    async def go(self, timeout: float) -> None:  # noqa: ASYNC109
        """Let it work; returns when it found the queue empty (it stays alive until `stop`).

        Raises:
            RuntimeError: it did not finish in time, or failed.
        """
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        if (said := await self._line(timeout)) != "done":
            raise RuntimeError(f"the Procrastinate worker did not finish (said {said!r})")

    async def stop(self) -> None:
        """Tell it to exit (end of its stdin), SIGKILL by pid after 10 s."""
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
        if proc.stdout is not None:
            proc.stdout.close()
