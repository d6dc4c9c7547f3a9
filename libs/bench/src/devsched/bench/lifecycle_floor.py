"""The lifecycle's equal-writes floor: a task's durable rows and messages, written with no product logic.

    python -m devsched.bench.lifecycle_floor DSN NATS_URL TASKS CONCURRENCY TASK_BYTES ATTEMPT_BYTES EVENT_BYTES

What devsched must write for one no-op task, and nothing else: the transactions of its store (`SCRIPT`: a
submit, then an assignment, a claim and a report, each one statement and one commit), their 12 row
versions (a task row inserted and updated three times, an attempt row inserted and updated twice, five
event rows inserted) in the bench's floor database, rows as wide as devsched's on average, and after
each commit the transaction's events as JetStream messages on a file stream of their own (fsync'd like
every stream of the bench's server), each with a `Nats-Msg-Id`, each acknowledged before the task's next
transaction. No selector, no reservation, no lease check, no agent: what is left when all the product's
logic costs nothing, so that "as fast as it can be" is a number in the same run.

The process prints `ready` once its tables and stream exist, then takes commands on stdin, one per line:
`submit` inserts the tasks one by one (like the bench's submits), `run` runs them to their end at
CONCURRENCY at once (like one agent with that many devices); each prints `{"seconds": ...}` when done.
The bench reads the CPU of this process, Postgres and nats-server around each command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import nats
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from devsched.bench.probes import CpuMeter
from devsched.embedded.supervisor import popen

#: What a figure beside this floor is beside.
FLOOR_NAME = "floor: the same rows and messages per task, no product logic"
#: The floor's stream and its subjects.
STREAM = "BENCH_FLOOR_LIFECYCLE"
SUBJECT = "bench.floor.lifecycle"

_TABLES = (
    "DROP TABLE IF EXISTS floor_tasks, floor_attempts, floor_events",
    "CREATE TABLE floor_tasks (task_id uuid PRIMARY KEY, status text NOT NULL, updated_at timestamptz NOT NULL,"
    " event_seq int NOT NULL, body text NOT NULL)",
    "CREATE TABLE floor_attempts (task_id uuid NOT NULL, attempt int NOT NULL, status text NOT NULL,"
    " expires_at timestamptz, body text NOT NULL, PRIMARY KEY (task_id, attempt))",
    "CREATE TABLE floor_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, task_id uuid NOT NULL,"
    " kind text NOT NULL, data text NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class Transition:
    """One transaction of a task's lifecycle: its one statement, and the events it publishes."""

    name: str
    statement: str
    events: tuple[str, ...]
    body: str | None = None
    """The row it inserts (`task`, `attempt`; its padding is `$3`), or None."""


def _move(status: str) -> str:
    return (
        f"UPDATE floor_tasks SET status = '{status}', updated_at = now(), event_seq = event_seq + 1 WHERE task_id = $1"
    )


def _events(kinds: Sequence[str]) -> str:
    values = ", ".join(f"($1, '{kind}', $2)" for kind in kinds)
    return f"INSERT INTO floor_events (task_id, kind, data) VALUES {values}"


#: devsched's store, transaction by transaction (`tests/integration/store/test_outbox_history.py` counts
#: its row versions): 4 commits, 12 row versions, 5 messages per task.
SCRIPT = (
    Transition(
        "submit",
        f"WITH t AS (INSERT INTO floor_tasks VALUES ($1, 'queued', now(), 1, $3)) {_events(['submitted'])}",
        ("submitted",),
        "task",
    ),
    Transition(
        "assign",
        "WITH a AS (INSERT INTO floor_attempts VALUES ($1, 1, 'assigned', now() + interval '30 seconds', $3)),"
        f" t AS ({_move('assigned')}) {_events(['assigned', 'assignment'])}",
        ("assigned", "assignment"),
        "attempt",
    ),
    Transition(
        "claim",
        "WITH a AS (UPDATE floor_attempts SET status = 'active', expires_at = now() + interval '30 seconds'"
        f" WHERE task_id = $1 AND attempt = 1), t AS ({_move('running')}) {_events(['dispatched'])}",
        ("dispatched",),
    ),
    Transition(
        "report",
        "WITH a AS (UPDATE floor_attempts SET status = 'done', expires_at = NULL"
        f" WHERE task_id = $1 AND attempt = 1), t AS ({_move('done')}) {_events(['done'])}",
        ("done",),
    ),
)


class Floor:
    """The floor's connections and padding."""

    def __init__(self, pool: asyncpg.Pool, js: JetStreamContext, sizes: tuple[int, int, int]) -> None:
        self._pool = pool
        self._js = js
        task_bytes, attempt_bytes, event_bytes = sizes
        self._bodies = {"task": "t" * task_bytes, "attempt": "a" * attempt_bytes}
        self._event = "e" * event_bytes
        self._message = self._event.encode()

    async def work(self, queue: list[uuid.UUID]) -> None:
        """Run tasks taken from the end of `queue` to their end, one at a time, until it is empty."""
        while queue:
            task_id = queue.pop()
            for transition in SCRIPT[1:]:
                await self.step(task_id, transition)

    async def step(self, task_id: uuid.UUID, transition: Transition) -> None:
        """One transaction (one statement), then its events published, each acknowledged."""
        args: tuple[object, ...] = (task_id, self._event)
        if transition.body is not None:
            args = (*args, self._bodies[transition.body])
        await self._pool.execute(transition.statement, *args)
        for kind in transition.events:
            await self._js.publish(
                f"{SUBJECT}.{task_id}", self._message, stream=STREAM, headers={"Nats-Msg-Id": f"{task_id}.{kind}"}
            )


async def _serve(dsn: str, url: str, tasks: int, concurrency: int, sizes: tuple[int, int, int]) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
    nc = await nats.connect(url)
    try:
        async with pool.acquire() as conn:
            for statement in _TABLES:
                await conn.execute(statement)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{SUBJECT}.>"], storage=StorageType.FILE))
        floor = Floor(pool, js, sizes)
        ids = [uuid.uuid4() for _ in range(tasks)]
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while command := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            started = time.perf_counter()
            if command == "submit":
                for task_id in ids:
                    await floor.step(task_id, SCRIPT[0])
            elif command == "run":
                queue = list(reversed(ids))
                await asyncio.gather(*(floor.work(queue) for _ in range(concurrency)))
            else:
                raise SystemExit(f"unknown command {command!r}")
            print(json.dumps({"seconds": time.perf_counter() - started}), flush=True)
        await js.delete_stream(STREAM)
        async with pool.acquire() as conn:
            await conn.execute(_TABLES[0])
    finally:
        await nc.close()
        await pool.close()


#: Columns of a floor row besides its padding, in bytes (tuple header, ids, status, times), roughly.
_FIXED_BYTES = 60

_WIDTHS = """
SELECT (SELECT coalesce(avg(pg_column_size(t.*)), 0)::int FROM tasks t),
       (SELECT coalesce(avg(pg_column_size(a.*)), 0)::int FROM attempts a),
       (SELECT coalesce(avg(pg_column_size(o.*)), 0)::int FROM outbox o)
"""


async def widths(conn: asyncpg.Connection) -> tuple[int, int, int]:
    """The paddings that make the floor's task, attempt and event rows as wide as devsched's, on average."""
    row = await conn.fetchrow(_WIDTHS)
    task, attempt, event = (max(0, int(v) - _FIXED_BYTES) for v in row)
    return task, attempt, event


@dataclass
class FloorRun:
    """One floor run at one concurrency: the submits, then the run, with the CPU of each process."""

    concurrency: int
    tasks: int
    submit_s: float
    run_s: float
    run_cpu_s: dict[str, float]

    @property
    def tasks_per_s(self) -> float:
        """Tasks run to their end per second."""
        return self.tasks / self.run_s

    def cpu_ms_per_task(self) -> float:
        """CPU ms per task, every process."""
        return 1000 * sum(self.run_cpu_s.values()) / self.tasks

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output."""
        return {
            "concurrency": self.concurrency,
            "tasks": self.tasks,
            "submit_s": round(self.submit_s, 4),
            "run_s": round(self.run_s, 4),
            "tasks_per_s": round(self.tasks_per_s, 1),
            "run_cpu_s": {k: round(v, 4) for k, v in self.run_cpu_s.items()},
            "cpu_ms_per_task": round(self.cpu_ms_per_task(), 4),
        }


async def run_floor(
    dsn: str,
    nats_url: str,
    servers: Mapping[str, int | None],
    concurrency: int,
    tasks: int,
    sizes: tuple[int, int, int],
) -> FloorRun:
    """Start the floor's process, have it submit then run `tasks` tasks at `concurrency`; its figures.

    `servers` names the pids of Postgres and nats-server, whose CPU counts with the floor process's.

    Raises:
        RuntimeError: the process exited or answered something else.
    """
    argv = [sys.executable, "-m", "devsched.bench.lifecycle_floor", dsn, nats_url, str(tasks), str(concurrency)]
    proc = popen(
        [*argv, *(str(s) for s in sizes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        death_signal=signal.SIGTERM,
    )
    try:
        await _answer(proc, "ready", None)
        submit_s = await _answer(proc, "", "submit")
        meter = CpuMeter({"client": proc.pid, **servers})
        meter.start()
        run_s = await _answer(proc, "", "run")
        run_cpu = meter.stop()
        assert proc.stdin is not None
        proc.stdin.close()
        await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stdin):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    return FloorRun(concurrency, tasks, submit_s, run_s, run_cpu)


async def _answer(proc: subprocess.Popen[str], expected: str, command: str | None) -> float:
    """Send `command` (if any) and read the floor's answer: `expected` (a word), or its seconds."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    if command is not None:
        proc.stdin.write(f"{command}\n")
        proc.stdin.flush()
    line = (await asyncio.to_thread(proc.stdout.readline)).strip()
    if expected:
        if line != expected:
            raise RuntimeError(f"the lifecycle floor did not start (said {line!r})")
        return 0.0
    try:
        return float(json.loads(line)["seconds"])
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"the lifecycle floor failed at {command} (said {line!r})") from None


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the floor's commands until stdin closes."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 7:
        sys.exit(f"usage: {__doc__}")
    dsn, url, tasks, concurrency, *sizes = args
    task_bytes, attempt_bytes, event_bytes = (int(s) for s in sizes)
    asyncio.run(_serve(dsn, url, int(tasks), int(concurrency), (task_bytes, attempt_bytes, event_bytes)))


if __name__ == "__main__":  # pragma: no cover
    main()
