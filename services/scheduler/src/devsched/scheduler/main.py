"""`devsched-scheduler`: run a scheduler replica, or apply the database migrations (`--migrate`).

    devsched-scheduler --database-url postgresql+asyncpg://... --nats-url nats://...
    devsched-scheduler --migrate        # apply the migrations and exit (until `devsched migrate` exists)
    devsched-scheduler --check-config   # check the settings, their files, NATS and the database; exit

Every setting is an environment variable `DEVSCHED_<NAME>` and a flag `--<name>` (see `--help`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Sequence

from devsched.scheduler.app import Scheduler
from devsched.scheduler.budget import StoreTooSmall
from devsched.scheduler.settings import SchedulerSettings
from devsched.service import (
    Stopped,
    configure_logging,
    parse_settings,
    run,
    settle_heap,
    setup_tracing,
    shutdown_tracing,
)
from devsched.service.preflight import Check, check_config
from devsched.store.health import DatabaseNotReady, reach_database

log = logging.getLogger("devsched.scheduler")


def _extra_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--migrate",
        action="store_true",
        help="apply the database migrations to DEVSCHED_DATABASE_URL and exit (idempotent)",
    )


def migrate(settings: SchedulerSettings) -> int:
    """Apply every migration; 0 on success, 1 (logged) on failure."""
    from devsched.store.migrations import upgrade

    try:
        upgrade(settings.database_dsn)
    except Exception:
        log.exception("migration failed")
        return 1
    log.info("database migrated")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    settings, options = parse_settings(
        SchedulerSettings,
        argv,
        prog="devsched-scheduler",
        description="devsched scheduler: the NATS service, outbox relay and assignment loop.",
        extend=_extra_flags,
    )
    if options.check_config:
        database = Check("database", lambda: reach_database(settings.database_dsn), (DatabaseNotReady,))
        return check_config("devsched-scheduler", settings, database)
    configure_logging(settings.log_level, service="devsched-scheduler")
    setup_tracing("devsched-scheduler")
    if options.migrate:
        return migrate(settings)

    async def serve(stop: asyncio.Event) -> int:
        with contextlib.suppress(Stopped):  # stopped before NATS came up
            try:
                await Scheduler(settings).run(stop)
            except StoreTooSmall as exc:
                log.error("%s", exc)  # one line: the budgets and the store
                return 2
        return 0

    settle_heap()
    try:
        return run(serve)
    finally:
        shutdown_tracing()  # export the last spans
