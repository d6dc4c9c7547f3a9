"""`devsched up`: its options, handed to `devsched.client.up`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from devsched.client.cli.common import settings


def up(
    ctx: typer.Context,
    data_dir: Annotated[
        Path, typer.Option(help="Where the embedded servers, agent configs and logs live; a second `up` reuses it.")
    ] = Path(".devsched"),
    hosts: Annotated[int, typer.Option(min=1, max=50, help="Simulated hosts (one agent process each).")] = 2,
    devices_per_host: Annotated[int, typer.Option(min=1, max=50, help="Simulated devices per host.")] = 2,
    demo: Annotated[bool, typer.Option("--demo/--no-demo", help="Submit the demo workload.")] = True,
    exit_when_done: Annotated[
        bool,
        typer.Option(
            help="Exit once the demo has ended: 0 when every demo task "
            "ended as expected, 1 otherwise (or after --demo-timeout)."
        ),
    ] = False,
    demo_timeout: Annotated[
        float, typer.Option(min=1, help="With --exit-when-done: give up after this many seconds.")
    ] = 120.0,
    nats_url: Annotated[
        str | None, typer.Option("--nats-url", help="Use this NATS server (JetStream on) instead of an embedded one.")
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Use this Postgres (postgresql+asyncpg://...) instead of an embedded one; it is migrated.",
        ),
    ] = None,
    nats_port: Annotated[
        int,
        typer.Option(
            min=0, max=65535, help="Port of the embedded NATS; 0 for any free port (also used when the port is busy)."
        ),
    ] = 4222,
    postgres_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of the embedded Postgres; 0 for any free port.")
    ] = 0,
    log_level: Annotated[
        str, typer.Option(help="Log level of the services (their logs go to <data-dir>/logs/).")
    ] = "INFO",
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="Live tables (default: when the output is a terminal) or plain progress lines.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run everything locally: NATS, Postgres, scheduler, sweeper, simulated hosts, and a demo."""
    from devsched.client.up import UpOptions, run_up  # the rest of the CLI does not need it

    global_options = settings(ctx)
    options = UpOptions(
        data_dir=data_dir,
        hosts=hosts,
        devices_per_host=devices_per_host,
        demo=demo,
        exit_when_done=exit_when_done,
        nats_url=nats_url,
        database_url=database_url,
        nats_port=nats_port,
        postgres_port=postgres_port,
        prefix=global_options.prefix,
        creds=global_options.creds,
        demo_timeout_s=demo_timeout,
        log_level=log_level.upper(),
        live=live,
    )
    raise typer.Exit(run_up(options))
