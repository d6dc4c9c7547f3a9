"""The scheduler's readiness: what must hold before it is counted as serving (`/readyz`).

| check | passes when |
| --- | --- |
| `nats` | connected, and the server answers a PING |
| `database` | `SELECT 1` answers, as the scheduler's role, on its pool |
| `schema` | the database is at this release's migration (`alembic_version` = the migrations' head) |
| `service` | the micro service `P-scheduler` lists every endpoint and takes requests (not from a shutdown on) |

A scheduler waiting for Postgres (a wrong password, a server away) keeps serving NATS with 503 replies
and stays alive (`/healthz`), but is not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsched.scheduler.service import endpoints_registered
from devsched.service import HealthServer, NotReady, check_nats
from devsched.service.health import plainly
from devsched.store.health import DatabaseNotReady, check_schema, ping

if TYPE_CHECKING:
    from devsched.scheduler.app import Scheduler


def add_checks(health: HealthServer, scheduler: Scheduler) -> None:
    """Register the four checks of the table above, reading `scheduler`'s parts as they come up."""

    async def nats() -> None:
        await check_nats(scheduler.nc)

    async def database() -> None:
        if scheduler.store is None:
            raise NotReady("not connected yet")
        await plainly(ping(scheduler.store.engine), DatabaseNotReady)

    async def schema() -> None:
        if scheduler.store is None:
            raise NotReady("not connected yet")
        await plainly(check_schema(scheduler.store.engine), DatabaseNotReady)

    async def service() -> None:
        if scheduler.service is None:
            raise NotReady("not started yet")
        if not scheduler.taking_requests:
            raise NotReady("not taking requests (starting or shutting down)")
        listed, expected = endpoints_registered(scheduler.service), scheduler.endpoints_expected
        if listed != expected:
            raise NotReady(f"{listed} of {expected} endpoints registered")

    for name, check in (("nats", nats), ("database", database), ("schema", schema), ("service", service)):
        health.check(name, check)
