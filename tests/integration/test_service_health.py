"""Each service's `/healthz` and `/readyz` with the real servers: what makes it ready, and what keeps it not.

The scheduler runs as a real process (`DEVSCHED_METRICS_PORT`): with a wrong database password it stays alive
and never becomes ready, naming the database; with good settings it becomes ready, and `nats micro stats`
counts its error replies. The sweeper and the agent serve in the test's loop with `metrics_port = 0`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.agent.config import parse_config
from devsched.embedded import PostgresServer, free_port
from devsched.embedded.postgres_server import FAST_SETTINGS
from devsched.store.health import expected_revision
from devsched.sweeper.app import SweeperSettings
from support.agent_harness import Running
from support.databases import service_url
from support.polling import eventually
from support.probes import probe, probe_or_none
from support.scheduler_harness import (
    FAST,
    ServiceProcess,
    delete_streams,
    running_scheduler,
    running_sweeper,
    scheduler_process,
    scheduler_settings,
    service_env,
)

pytestmark = pytest.mark.integration

#: How long a scheduler with a wrong password is watched never becoming ready.
NEVER_READY_S = 6.0
RIGHT_PASSWORD = "right-horse-battery"
ROLE = "health_scheduler"


@pytest.fixture(scope="module")
def password_postgres() -> Iterator[PostgresServer]:
    """A Postgres that checks passwords over TCP (scram-sha-256), unlike the session's `trust` server.

    Role `health_scheduler` (password `RIGHT_PASSWORD`) owns the empty database `health`. Made under the
    system temp dir: as root the server runs as its own user, who must read the hba file.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="devsched-health-pg-"))
    hba = data_dir / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    server = PostgresServer(data_dir, settings={**FAST_SETTINGS, "hba_file": str(hba)})
    account = server._run_as()
    if account is not None:
        os.chown(hba, *account)
    with server:
        psql = [str(server.bin_dir / "psql"), "-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres"]
        for statement in (
            f"CREATE ROLE {ROLE} LOGIN PASSWORD '{RIGHT_PASSWORD}'",
            f"CREATE DATABASE health OWNER {ROLE}",
        ):
            subprocess.run([*psql, "-d", "postgres", "-c", statement], check=True, capture_output=True, timeout=30)
        yield server
    shutil.rmtree(data_dir, ignore_errors=True)


def _url(server: PostgresServer, password: str) -> str:
    return f"postgresql+asyncpg://{ROLE}:{password}@127.0.0.1:{server.port}/health"


@pytest.fixture
async def streams_deleted(nc: NatsClient, subject_prefix: str) -> AsyncIterator[None]:
    yield
    await delete_streams(nc, subject_prefix)


def start_scheduler(env: dict[str, str], log_path: Path) -> ServiceProcess:
    """A scheduler process given `env` as it is (the database URL is not turned into the scheduler's role's)."""
    return ServiceProcess("devsched.scheduler", env, log_path).start()


async def readiness(port: int, process: ServiceProcess) -> tuple[int, Any] | None:
    """`/readyz` of a process that must stay up."""
    assert process.running, f"exited with {process.exit_code}:\n{process.tail()}"
    return await probe_or_none(port, "/readyz")


async def test_a_scheduler_with_a_wrong_database_password_is_alive_but_never_ready(
    password_postgres: PostgresServer, nats_url: str, subject_prefix: str, tmp_path: Path, streams_deleted: None
) -> None:
    port = free_port()
    env = service_env(_url(password_postgres, "wrong-password"), nats_url, subject_prefix, metrics_port=port)
    scheduler = start_scheduler(env, tmp_path / "scheduler.log")
    try:
        await scheduler.wait_logged("serving")  # NATS and the micro service are up: only Postgres is not
        deadline = time.monotonic() + NEVER_READY_S
        seen = 0
        while time.monotonic() < deadline:  # bounded: every answer in NEVER_READY_S is "not ready"
            answer = await readiness(port, scheduler)
            assert answer is not None
            status, body = answer
            assert status == 503, body
            assert body["ready"] is False
            database = body["checks"]["database"]
            assert database["ok"] is False
            assert "password authentication failed" in database["error"], database
            assert "wrong-password" not in json.dumps(body)  # the reason never carries the URL
            assert body["checks"]["nats"] == {"ok": True}
            assert body["checks"]["service"] == {"ok": True}
            seen += 1
            await asyncio.sleep(0.3)
        assert seen >= 5
        status, alive = await probe(port, "/healthz")  # alive all along: the kubelet must not restart it
        assert status == 200
        assert alive["uptime_s"] > NEVER_READY_S / 2
    finally:
        scheduler.stop()


async def test_the_schema_check_names_a_database_that_was_never_migrated(
    password_postgres: PostgresServer, nats_url: str, subject_prefix: str, tmp_path: Path, streams_deleted: None
) -> None:
    port = free_port()
    env = service_env(_url(password_postgres, RIGHT_PASSWORD), nats_url, subject_prefix, metrics_port=port)
    scheduler = start_scheduler(env, tmp_path / "scheduler.log")
    try:

        async def schema_named() -> dict[str, Any] | None:
            answer = await readiness(port, scheduler)
            if answer is None or not answer[1]["checks"]["database"]["ok"]:
                return None
            return dict(answer[1])

        body = await eventually(schema_named, timeout=30, message="the database check passes")
        assert body["ready"] is False
        assert body["checks"]["schema"] == {
            "ok": False,
            "error": f"the database is not migrated (this release expects {expected_revision()}): run the migrations",
        }
    finally:
        scheduler.stop()


async def test_a_scheduler_with_good_settings_becomes_ready_and_its_micro_stats_count_errors(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path, streams_deleted: None
) -> None:
    port = free_port()
    env = service_env(database_url, nats_url, subject_prefix, metrics_port=port)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    try:

        async def ready() -> Any:
            answer = await readiness(port, scheduler)
            return answer[1] if answer is not None and answer[0] == 200 else None

        body = await eventually(ready, timeout=30, message="the scheduler ready")
        assert body["checks"] == {name: {"ok": True} for name in ("database", "nats", "schema", "service")}

        missing = await nc.request(
            f"{subject_prefix}.api.tasks.get", json.dumps({"task_id": str(uuid.uuid4())}).encode()
        )
        assert missing.headers is not None
        assert missing.headers["Nats-Service-Error-Code"] == "404"

        async def counted() -> dict[str, Any] | None:
            reply = await nc.request(f"$SRV.STATS.{subject_prefix}-scheduler", b"", timeout=2)
            stats = next(e for e in json.loads(reply.data)["endpoints"] if e["name"] == "tasks-get")
            return stats if stats["num_errors"] == 1 else None

        stats = await eventually(counted, message="the 404 counted as an error")
        assert stats["num_requests"] == 1
        assert stats["last_error"].startswith("404:not_found ")
        assert stats["processing_time"] > 0
    finally:
        scheduler.stop()


async def test_an_in_process_scheduler_is_not_ready_once_it_stops_taking_requests(
    database_url: str, nats_url: str, subject_prefix: str, streams_deleted: None
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, metrics_port=0)
    async with running_scheduler(settings) as scheduler:
        assert scheduler.health is not None
        scheduler.health.readiness.cache_s = 0
        status, _ = await eventually(lambda: probe(scheduler.health.port, "/readyz"), message="ready")
        assert status == 200
        scheduler.taking_requests = False  # what the start of a shutdown does
        status, body = await probe(scheduler.health.port, "/readyz")
        assert status == 503
        assert body["checks"]["service"]["error"] == "not taking requests (starting or shutting down)"
        scheduler.taking_requests = True


async def test_the_sweeper_is_ready_without_nats(database_url: str, subject_prefix: str) -> None:
    """NATS only wakes the schedulers sooner: the sweeper sweeps, and is ready, without it."""
    settings = SweeperSettings(
        database_url=service_url(database_url, "sweeper"),
        nats_url=f"nats://127.0.0.1:{free_port()}",  # nothing listens there
        subject_prefix=subject_prefix,
        metrics_port=0,
        **{k: v for k, v in FAST.items() if k in SweeperSettings.model_fields},
    )
    async with running_sweeper(settings) as sweeper:
        assert sweeper.health is not None
        status, body = await probe(sweeper.health.port, "/readyz")
        assert status == 200, body
        assert body["checks"] == {"database": {"ok": True}, "schema": {"ok": True}}
        assert sweeper._nc is None  # it really has no NATS


async def test_the_sweeper_is_not_ready_with_a_wrong_database_password(
    password_postgres: PostgresServer, subject_prefix: str
) -> None:
    settings = SweeperSettings(
        database_url=_url(password_postgres, "wrong-password"),
        nats_url=f"nats://127.0.0.1:{free_port()}",
        subject_prefix=subject_prefix,
        metrics_port=0,
        sweep_interval_s=0.2,
    )
    async with running_sweeper(settings) as sweeper:
        assert sweeper.health is not None
        status, body = await probe(sweeper.health.port, "/readyz")
        assert status == 503
        assert set(body["checks"]) == {"database", "schema"}
        assert "password authentication failed" in body["checks"]["database"]["error"]


async def test_the_agent_is_ready_once_registered_and_bound(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path, streams_deleted: None
) -> None:
    config = parse_config(
        {
            "host_id": f"h-{uuid.uuid4().hex[:8]}",
            "spool_dir": str(tmp_path / "spool"),
            "work_dir": str(tmp_path / "work"),
            "nats_url": nats_url,
            "subject_prefix": subject_prefix,
            "request_timeout_s": 1.0,
            "metrics_port": 0,
            "devices": [{"device_id": f"{subject_prefix}-d1"}],
        }
    )
    running = Running(config)
    try:
        # No scheduler yet: connected to NATS, alive, not registered, not ready.
        health = await eventually(lambda: running.agent.health, message="the agent's health endpoints up")

        async def connected_not_ready() -> Any:
            _, body = await probe(health.port, "/readyz")
            return body if body["checks"]["nats"]["ok"] else None

        health.readiness.cache_s = 0
        body = await eventually(connected_not_ready, message="the agent connected to NATS")
        assert body["ready"] is False
        assert body["checks"]["registered"] == {"ok": False, "error": "not registered with the scheduler yet"}
        assert body["checks"]["consumer"] == {"ok": False, "error": "not bound to the assignments consumer yet"}
        assert (await probe(health.port, "/healthz"))[0] == 200

        settings = scheduler_settings(database_url, nats_url, subject_prefix)
        async with running_scheduler(settings):
            await running.ready()  # bound to its consumer
            status, body = await probe(health.port, "/readyz")
            assert status == 200, body
            assert body["checks"] == {name: {"ok": True} for name in ("consumer", "nats", "registered", "reports")}
            running.agent.request_drain("signal")
            status, body = await probe(health.port, "/readyz")
            assert status == 503
            assert body["checks"]["consumer"] == {"ok": False, "error": "draining: taking no more work"}
            assert await running.shut_down() == 0
    finally:
        if not running.task.done():
            await running.shut_down()
