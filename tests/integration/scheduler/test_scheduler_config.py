"""Configuration (environment and flags of the same names) and the `--migrate` entry point."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from devsched.scheduler.settings import SchedulerSettings
from devsched.service.flags import parse_settings
from devsched.sweeper.app import SweeperSettings
from support.databases import create_test_database, drop_database, ensure_test_roles
from support.servers import PostgresHandle

pytestmark = pytest.mark.integration


def test_flags_override_environment_which_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_NATS_URL", "nats://from-env:4222")
    monkeypatch.setenv("DEVSCHED_HEARTBEAT_INTERVAL_S", "0.5")
    monkeypatch.setenv("DEVSCHED_CREATE_STREAMS", "false")
    settings, _ = parse_settings(
        SchedulerSettings, ["--nats-url", "nats://from-flag:4222", "--device-grace-s", "2.5"], prog="x", description=""
    )
    assert settings.nats_url == "nats://from-flag:4222"
    assert settings.heartbeat_interval_s == 0.5
    assert settings.device_grace_s == 2.5
    assert settings.create_streams is False
    assert (settings.subject_prefix, settings.max_payload_bytes, settings.drain_timeout_s) == ("devsched", 524288, 5)
    flagged, _ = parse_settings(SchedulerSettings, ["--create-streams"], prog="x", description="")
    assert flagged.create_streams is True


def test_sweeper_reads_the_same_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_SUBJECT_PREFIX", "lab-2")
    monkeypatch.setenv("DEVSCHED_DATABASE_URL", "postgresql+asyncpg://u@db/x")
    settings, _ = parse_settings(SweeperSettings, ["--sweep-batch", "10"], prog="x", description="")
    assert (settings.subject_prefix, settings.database_url, settings.sweep_batch) == (
        "lab-2",
        "postgresql+asyncpg://u@db/x",
        10,
    )


@pytest.mark.parametrize(
    ("settings_type", "args", "named"),
    [
        (SchedulerSettings, ["--subject-prefix", "a.b"], "DEVSCHED_SUBJECT_PREFIX / --subject-prefix"),
        (SweeperSettings, ["--sweep-interval-s", "0"], "DEVSCHED_SWEEP_INTERVAL_S / --sweep-interval-s"),
        (SchedulerSettings, ["--duplicate-window-s", "999999999"], "duplicate_window_s"),
        (SchedulerSettings, ["--max-payload-bytes", "lots"], "DEVSCHED_MAX_PAYLOAD_BYTES / --max-payload-bytes"),
    ],
)
def test_invalid_configuration_exits_2_naming_the_setting(
    settings_type: type[SchedulerSettings | SweeperSettings],
    args: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(settings_type, args, prog="x", description="")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err
    assert named in err


@pytest.fixture
def empty_database(postgres_server: PostgresHandle) -> Iterator[str]:
    # The clone is owned by the owner role: make sure the roles exist even when this test runs alone.
    ensure_test_roles(postgres_server.url())
    name = create_test_database(postgres_server.dsn(), "template0")
    yield name
    drop_database(postgres_server.dsn(), name)


def test_migrate_entry_point_applies_the_schema_idempotently(
    postgres_server: PostgresHandle, empty_database: str
) -> None:
    env = {"DEVSCHED_DATABASE_URL": postgres_server.url(empty_database), "PATH": ""}
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "devsched.scheduler", "--migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert '"msg": "database migrated"' in proc.stderr

    async def tables() -> set[str]:
        engine = create_async_engine(postgres_server.url(empty_database))
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
                return {str(r.tablename) for r in rows}
        finally:
            await engine.dispose()

    assert {"tasks", "attempts", "cancel_requests", "outbox"} <= asyncio.run(tables())
