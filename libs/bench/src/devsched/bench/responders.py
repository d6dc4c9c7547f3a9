"""The floors' responders, each a process of its own like the scheduler (so none shares the load's loop).

    python -m devsched.bench.responders echo NATS_URL SUBJECT
    python -m devsched.bench.responders update NATS_URL SUBJECT DSN POOL_SIZE
    python -m devsched.bench.responders batch NATS_URL SUBJECT DSN POOL_SIZE

`echo` answers every request with its own body: the bare request/reply floor. `update` is the renewal
floor: for each request it runs one `UPDATE ... RETURNING` of the lease named in the body (and the host
named in the subject, `<anything>.<host_id>.<verb>`) on the same Postgres, one request per task at up to
64 at once (the scheduler's default `max_concurrency`), and answers a lease reply. `batch` is the floor of
a host's batched renewals: the body lists several leases (`{"leases": [...]}`, as `renewals` does), one
set-based `UPDATE ... FROM unnest(...) RETURNING` renews them all, and the reply has one outcome per lease
in order (an `error` for a lease it did not renew). All print `ready` once subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from devsched.embedded.supervisor import popen

#: The floor's table, in the floor database: one row per lease.
FLOOR_TABLE = """
CREATE TABLE IF NOT EXISTS floor_leases (
    lease_id uuid PRIMARY KEY,
    host_id text NOT NULL,
    expires_at timestamptz NOT NULL
)
"""
#: The one statement of a floor renewal.
FLOOR_RENEW = (
    "UPDATE floor_leases SET expires_at = now() + interval '30 seconds'"
    " WHERE lease_id = $1 AND host_id = $2 RETURNING expires_at"
)
#: The one statement of a floor batch: every lease of the list that is the host's.
FLOOR_RENEW_MANY = (
    "UPDATE floor_leases f SET expires_at = now() + interval '30 seconds'"
    " FROM unnest($1::uuid[]) AS r(lease_id)"
    " WHERE f.lease_id = r.lease_id AND f.host_id = $2 RETURNING f.lease_id, f.expires_at"
)
#: What a figure beside the `update` responder is beside.
FLOOR_NAME = "floor: nats-py responder, one UPDATE ... RETURNING"
#: What a figure beside the `batch` responder is beside.
BATCH_FLOOR_NAME = "floor: nats-py responder, one UPDATE ... FROM unnest(...) RETURNING per request"
#: Requests handled at once by the floor responder (the scheduler's default max_concurrency).
MAX_CONCURRENCY = 64


async def _echo(url: str, subject: str) -> None:
    nc = await nats.connect(url, name="bench-echo")

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(subject, queue="bench-echo", cb=echo)
    await _serve(nc)


async def _renew_one(pool: asyncpg.Pool, host_id: str, data: bytes) -> dict[str, Any]:
    lease = json.loads(data)
    expires_at = await pool.fetchval(FLOOR_RENEW, lease["lease_id"], host_id)
    return {"expires_at": expires_at.isoformat(), "ttl_s": 30, "cancel_requested": False}


async def _renew_many(pool: asyncpg.Pool, host_id: str, data: bytes) -> dict[str, Any]:
    leases = json.loads(data)["leases"]
    rows = await pool.fetch(FLOOR_RENEW_MANY, [lease["lease_id"] for lease in leases], host_id)
    renewed = {str(row["lease_id"]): row["expires_at"] for row in rows}
    outcomes = []
    for lease in leases:
        named = {k: lease[k] for k in ("task_id", "attempt", "lease_id")}
        expires_at = renewed.get(lease["lease_id"])
        if expires_at is None:
            outcomes.append({**named, "error": {"code": "not_found", "message": "no such lease of the host"}})
        else:
            outcomes.append({**named, "expires_at": expires_at.isoformat(), "ttl_s": 30, "cancel_requested": False})
    return {"leases": outcomes}


async def _update(
    url: str,
    subject: str,
    dsn: str,
    pool_size: int,
    renew: Callable[[asyncpg.Pool, str, bytes], Awaitable[dict[str, Any]]],
) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size)
    nc = await nats.connect(url, name="bench-floor")
    slots = asyncio.Semaphore(MAX_CONCURRENCY)
    running: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        async with slots:
            body = await renew(pool, msg.subject.split(".")[-2], msg.data)
            await msg.respond(json.dumps(body).encode())

    async def dispatch(msg: Msg) -> None:
        task = asyncio.create_task(answer(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    await nc.subscribe(subject, queue="bench-floor", cb=dispatch)
    try:
        await _serve(nc)
    finally:
        await pool.close()


async def _serve(nc: NatsClient) -> None:
    await nc.flush()
    await nc.flush()  # nats-py: one flush may not cover a SUB still in the write buffer
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Run a responder until SIGTERM."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["echo"] and len(args) == 3:
        asyncio.run(_echo(args[1], args[2]))
    elif args[:1] in (["update"], ["batch"]) and len(args) == 5:
        renew = _renew_one if args[0] == "update" else _renew_many
        asyncio.run(_update(args[1], args[2], args[3], int(args[4]), renew))
    else:
        sys.exit(f"usage: {__doc__}")


class Responder:
    """A responder process, started by the bench: `start()` returns once it is subscribed."""

    def __init__(self, *args: str) -> None:
        self.argv = [sys.executable, "-m", "devsched.bench.responders", *args]
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int | None:
        """Its pid while it runs."""
        return None if self.proc is None else self.proc.pid

    async def start(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Start it and wait for its `ready`.

        Raises:
            RuntimeError: it exited or said nothing in time.
        """
        self.proc = self._spawn()
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(stdout.readline), timeout)
        except TimeoutError:
            line = ""
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"responder {' '.join(self.argv[3:5])} did not start (said {line!r})")

    def _spawn(self) -> subprocess.Popen[str]:
        return popen(
            self.argv,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            death_signal=signal.SIGTERM,
        )

    def stop(self) -> None:
        """SIGTERM it (by pid) and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


if __name__ == "__main__":  # pragma: no cover
    main()
