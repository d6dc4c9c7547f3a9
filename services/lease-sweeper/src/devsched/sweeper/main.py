"""`devsched-sweeper`: run a lease-sweeper replica (`--check-config`: check the configuration and exit).

Every setting is an environment variable `DEVSCHED_<NAME>` and a flag `--<name>` (see `--help`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from devsched.service import configure_logging, parse_settings, run, setup_tracing, shutdown_tracing
from devsched.service.preflight import Check, check_config
from devsched.store.health import DatabaseNotReady, reach_database
from devsched.sweeper.app import Sweeper, SweeperSettings


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    settings, options = parse_settings(
        SweeperSettings,
        argv,
        prog="devsched-sweeper",
        description="devsched lease sweeper: ends expired leases and wakes the schedulers.",
    )
    if options.check_config:
        database = Check("database", lambda: reach_database(settings.database_dsn), (DatabaseNotReady,))
        return check_config("devsched-sweeper", settings, database)
    configure_logging(settings.log_level, service="devsched-sweeper")
    setup_tracing("devsched-sweeper")

    async def serve(stop: asyncio.Event) -> int:
        await Sweeper(settings).run(stop)
        return 0

    try:
        return run(serve)
    finally:
        shutdown_tracing()  # export the last spans
