"""Postgres faults under real services and agents: a slow, lossy, half-open or reset link, a crash (immediate
stop), a 10 s freeze (SIGSTOP of the postmaster and its backends), and backends killed mid-transaction.

Each scenario asserts its own expected outcome and ends with the shared invariant checker, which reads the
database directly (never through the proxy a scenario broke).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from sqlalchemy.engine import make_url

from support.agent_e2e import shell
from support.fault_lab import FaultLab, MakeLab, with_port
from support.invariants import plain_dsn
from support.polling import eventually
from support.scheduler_harness import ErrorReply, api, raw_request
from support.servers import PostgresHandle
from support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: Any statement of a transaction that changes state: every one writes its events to the outbox.
STATE_CHANGE = rb"INSERT\s+INTO\s+outbox"


@pytest.fixture
async def pg_proxy(postgres_server: PostgresHandle) -> AsyncIterator[TcpProxy]:
    """A proxy in front of the session's Postgres (ask for it before the lab: it must outlive the services)."""
    url = make_url(postgres_server.url())
    async with TcpProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        yield proxy


async def _submit_all(lab: FaultLab, count: int, *seconds: float, **fields: object) -> list[str]:
    return [await lab.submit(lab.journal.plan(*seconds), **fields) for _ in range(count)]


async def test_a_200ms_jittered_link_to_postgres_changes_no_outcome(
    pg_proxy: TcpProxy, make_lab: MakeLab, database_url: str
) -> None:
    # Unhurried heartbeats and ticks: at 0.5 s, heartbeats of multi-second transactions would take every pooled
    # connection (as they would in a deployment that far from its database); this is about outcomes.
    slow = {"heartbeat_interval_s": 5, "assign_tick_s": 1, "relay_tick_s": 1, "sweep_interval_s": 1}
    lab = await make_lab(database=with_port(database_url, pg_proxy.port), **slow)
    await lab.agent("d1", request_timeout_s=10).ready()
    pg_proxy.delay(0.2, 0.1)  # each round trip of each statement: 100-300 ms more
    lab.read_timeout_s = 10  # a tasks.get is several round trips: often more than the 2 s a try waits by default
    # A submit is one transaction that also places the task (several round trips): seconds at this distance.
    task_id = await lab.submit(lab.journal.plan(0.3), lease_ttl_s=30, timeout=30)
    view = await lab.wait_status(task_id, "done", "failed", within=90)

    assert (view["status"], view["attempt_count"]) == ("done", 1)
    pg_proxy.heal()
    await lab.inv.check()


async def test_a_commit_whose_reply_is_lost_is_answered_from_the_record_when_the_agent_retries(
    pg_proxy: TcpProxy, make_lab: MakeLab, database_url: str
) -> None:
    # Without the statement cache every statement carries its SQL, so the proxy can tell a state change.
    url = with_port(database_url, pg_proxy.port) + "?prepared_statement_cache_size=0"
    lab = await make_lab(database=url)
    agent = await lab.agent("d1").ready()
    gate, started = lab.gate("report"), lab.path("started")
    task_id = await lab.submit([shell("work", f"touch '{started}'; {gate.wait}")], lease_ttl_s=30)
    await eventually(started.exists, timeout=20, message="step started")
    await asyncio.sleep(0.5)  # the step-start renewal (a `progress` event) is committed and answered

    async with lab.inv.watch():
        pg_proxy.mute_after_commit(STATE_CHANGE)  # the next state change commits; its reply never comes back
        gate.open()  # the step ends: the agent reports
        await eventually(lambda: pg_proxy.counts["muted_commits"] == 1, timeout=15, message="report committed")
        recorded = await agent.wait_line("report recorded", task_id=task_id, timeout=30)
        pg_proxy.heal()  # the scheduler's stuck connection is reset

    # The first report committed but its handler never heard so; the agent's repeat was answered with what
    # was recorded, as a duplicate: one outcome, recorded once. (The stuck handler, reset by the heal, runs its
    # statement again and finds it recorded too: every answer the scheduler gave is a duplicate.)
    assert recorded["duplicate"] is True
    answers = [r["duplicate"] for r in lab.plane.scheduler_lines("reported", task_id=task_id)]
    assert answers
    assert all(answers)
    view = await lab.task(task_id)
    assert (view["status"], view["attempt_count"]) == ("done", 1)
    await lab.inv.check()


async def test_a_blackholed_then_reset_postgres_link_costs_no_work(
    pg_proxy: TcpProxy, make_lab: MakeLab, database_url: str
) -> None:
    lab, ttl = await make_lab(database=with_port(database_url, pg_proxy.port)), 8
    await lab.agent("d1", "d2", "d3").ready()
    async with lab.inv.watch():
        tasks = await _submit_all(lab, 3, 0.5, 0.5, 0.5, 0.5, lease_ttl_s=ttl)
        await eventually(lambda: len(lab.journal.runs()) >= 3, timeout=20, message="steps running")
        pg_proxy.blackhole()  # half-open: the services' statements hang, their new connections get no answer
        await asyncio.sleep(3)
        pg_proxy.heal()  # the far side comes back and answers the stale connections with an RST
        healed = await lab.inv.db_now()
        await lab.inv.recovered(healed, ttl_s=ttl, sweep_interval_s=0.2, grace_s=ttl)
        for _ in range(3):  # and resets of every connection, a second apart
            await asyncio.sleep(1)
            pg_proxy.reset()
        views = await lab.run_all(tasks, within=60)

    assert pg_proxy.counts["resets"] >= 3
    assert {v["status"] for v in views.values()} == {"done"}
    assert lab.plane.scheduler.running
    assert lab.plane.sweeper.running
    await lab.inv.check()


async def test_postgres_crashed_immediate_stop_loses_nothing_acknowledged(
    fault_lab: FaultLab, postgres_server: PostgresHandle
) -> None:
    lab = fault_lab
    await lab.agent("d1", "d2").ready()
    async with lab.inv.watch():
        tasks = await _submit_all(lab, 4, 0.4, 0.4, 0.4, lease_ttl_s=15)
        await eventually(lambda: len(lab.journal.runs()) >= 2, timeout=20, message="steps running")
        await asyncio.to_thread(postgres_server.signal, signal.SIGQUIT)  # `pg_ctl stop -m immediate`
        await asyncio.to_thread(postgres_server.wait_exit, 30)
        await asyncio.sleep(1)
        await asyncio.to_thread(postgres_server.start)  # crash recovery from the WAL
        views = await lab.run_all(tasks, within=60)

    # everything the services were told was committed survived; a crash shorter than a lease costs no attempt
    assert [(v["status"], v["attempt_count"]) for v in views.values()] == [("done", 1)] * 4
    assert lab.plane.scheduler.running
    assert lab.plane.sweeper.running
    await lab.inv.check()


async def test_postgres_frozen_for_10s_expires_only_the_short_lease(
    fault_lab: FaultLab, postgres_server: PostgresHandle, nc: NatsClient
) -> None:
    lab, short = fault_lab, 3
    await lab.agent("d1", "d2", "d3").ready()
    async with lab.inv.watch():
        long_lived = await lab.submit(lab.journal.plan(*[0.5] * 6), lease_ttl_s=30)
        short_lived = await lab.submit(lab.journal.plan(*[0.5] * 8), lease_ttl_s=short)
        await eventually(lambda: len(lab.journal.starts_of(short_lived).get(1, [])) >= 1, timeout=20, message="run")
        with postgres_server_paused(postgres_server):
            # nothing answers meanwhile: a submit gets no reply (or a 503), never a wrong one
            stray = {"selector": {"labels": {"no": "device"}}, "plan": {"steps": [{"name": "x", "action": "noop"}]}}
            body = json.dumps(stray).encode()
            with contextlib.suppress(nats.errors.TimeoutError):
                reply = await raw_request(nc, api(lab.prefix, "tasks.submit"), body, timeout=2)
                assert reply.headers is not None
                assert reply.headers["Nats-Service-Error-Code"] == "503"
            await asyncio.sleep(8)
        resumed = await lab.inv.db_now()
        await lab.inv.recovered(resumed, ttl_s=short, sweep_interval_s=0.2, grace_s=short)
        views = await lab.run_all([long_lived, short_lived], within=60)

    # The 30 s lease outlived the freeze; the 3 s one ran out by the database's clock: the agent stopped at a
    # step boundary when its own deadline passed, the sweeper ended it after the thaw, and attempt 2 ran.
    assert [(a["attempt"], a["status"]) for a in views[long_lived]["attempts"]] == [(1, "done")]
    assert [(a["attempt"], a["status"]) for a in views[short_lived]["attempts"]] == [(1, "expired"), (2, "done")]
    assert len(lab.journal.starts_of(short_lived)[1]) < 8
    await lab.inv.check()


@contextlib.contextmanager
def postgres_server_paused(server: PostgresHandle) -> Iterator[None]:
    """The server frozen (postmaster and backends) for the block, thawed afterwards even if the block fails."""
    server.pause()
    try:
        yield
    finally:
        server.resume()


async def test_backends_killed_mid_transaction_lose_nothing_acknowledged(
    fault_lab: FaultLab, database_url: str
) -> None:
    lab = fault_lab
    await lab.agent("d1", "d2", "d3", "d4").ready()
    database = make_url(database_url).database
    killed: list[int] = []
    refused: list[int] = []

    async def kill_backends(stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(plain_dsn(database_url))
        try:
            while not stop.is_set():
                pids = await conn.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = $1 AND usename LIKE 'devsched_%' AND pid <> pg_backend_pid()",
                    database,
                )
                killed.extend(1 for (terminated,) in pids if terminated)
                await asyncio.sleep(0.25)
        finally:
            await conn.close()

    async def submit_through(stop: asyncio.Event, tasks: list[str]) -> None:
        while not stop.is_set():
            try:
                tasks.append(await lab.submit(lab.journal.plan(0.2, 0.2), lease_ttl_s=10))
            except ErrorReply as exc:
                refused.append(exc.status)  # not acknowledged: the client knows to retry
            except nats.errors.TimeoutError:
                refused.append(0)
            await asyncio.sleep(0.1)

    tasks: list[str] = []
    async with lab.inv.watch():
        stop = asyncio.Event()
        started = time.monotonic()
        workers = [asyncio.create_task(kill_backends(stop)), asyncio.create_task(submit_through(stop, tasks))]
        await asyncio.sleep(6)
        stop.set()
        await asyncio.gather(*workers)
        views = await lab.run_all(tasks, within=60)

    assert len(killed) >= 10, f"only {len(killed)} backends killed in {time.monotonic() - started:.0f}s"
    assert set(refused) <= {503, 0}  # unavailable or no answer, never an internal error
    assert len(tasks) >= 10
    assert {v["status"] for v in views.values()} == {"done"}
    assert lab.plane.scheduler.running
    assert lab.plane.sweeper.running
    await lab.inv.check()
