"""The dev stack's commands of `devsched`: `up` and `migrate` (`bench` is devsched-bench's).

`up` hands its options to `devsched.devstack.stack`.

They reach the CLI through the `devsched.cli_plugins` entry point (`register`), so that devsched-client needs
neither the store nor the embedded servers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import typer

from devsched.client.cli.common import ExitCode, fail, settings
from devsched.protocol.tls import with_postgres_ssl

#: The dashboard's port unless `--web-port` says otherwise: the same URL from one run to the next.
DEFAULT_WEB_PORT = 8642
#: `DEVSCHED_DATABASE_URL`'s default, as the services have it.
DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/devsched"


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
    fast: Annotated[
        bool,
        typer.Option(
            "--fast",
            help="A throwaway run: Postgres without fsync and JetStream without sync on every write "
            "(an OS crash may lose acknowledged work). By default both are durable.",
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
    web: Annotated[
        bool,
        typer.Option(help="Start the web dashboard (devsched-web) on loopback, actions on, a login link printed."),
    ] = True,
    web_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="Port of the web dashboard on 127.0.0.1 (a free one when it is busy, said on screen); 0 for any.",
        ),
    ] = DEFAULT_WEB_PORT,
    rotate_web_token: Annotated[
        bool,
        typer.Option(
            "--rotate-web-token",
            help="Make a new dashboard token (ending every login of the old one) instead of reusing the one "
            "kept in $XDG_STATE_HOME/devsched/web-token (~/.local/state/devsched/web-token).",
        ),
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics", help="Serve each service's Prometheus /metrics on a free loopback port and list the URLs."
        ),
    ] = False,
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
    from devsched.devstack.stack import UpOptions, run_up  # `migrate` and `--help` do not need it

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
        web=web,
        web_port=web_port,
        rotate_web_token=rotate_web_token,
        metrics=metrics,
        prefix=global_options.prefix,
        creds=global_options.nats.nats_creds,
        demo_timeout_s=demo_timeout,
        log_level=log_level.upper(),
        live=live,
        fast=fast,
    )
    raise typer.Exit(run_up(options))


def _masked(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def migrate(
    database_url: Annotated[
        str,
        typer.Option(
            "--database-url", envvar="DEVSCHED_DATABASE_URL", help="postgresql+asyncpg://user:password@host:port/db"
        ),
    ] = DEFAULT_DATABASE_URL,
    ssl_root_cert: Annotated[
        Path | None,
        typer.Option(
            "--database-ssl-root-cert",
            envvar="DEVSCHED_DATABASE_SSL_ROOT_CERT",
            help="CA of the Postgres server: TLS with sslmode=verify-full.",
        ),
    ] = None,
    ssl_cert: Annotated[
        Path | None,
        typer.Option("--database-ssl-cert", envvar="DEVSCHED_DATABASE_SSL_CERT", help="Postgres client certificate."),
    ] = None,
    ssl_key: Annotated[
        Path | None,
        typer.Option("--database-ssl-key", envvar="DEVSCHED_DATABASE_SSL_KEY", help="Key of --database-ssl-cert."),
    ] = None,
) -> None:
    """Apply the database migrations (idempotent: an up-to-date database is left as is)."""
    from devsched.store.engine import DatabaseTlsError, ssl_connect_arg
    from devsched.store.migrations import upgrade  # imported here: alembic is slow to import

    dsn = with_postgres_ssl(database_url, ssl_root_cert, ssl_cert, ssl_key)
    try:
        ssl_connect_arg(dsn)  # a bad TLS parameter or file: one line, before alembic starts
    except DatabaseTlsError as exc:
        fail(str(exc), ExitCode.USAGE)
    try:
        upgrade(dsn)
    except (OSError, TimeoutError) as exc:
        fail(f"unavailable: cannot reach the database at {_masked(database_url)}: {exc}", ExitCode.UNAVAILABLE)
    except Exception as exc:
        kind = type(exc).__name__
        if "Connect" in kind or "CannotConnect" in kind or "InvalidCatalogName" in kind:
            fail(
                f"unavailable: cannot use the database at {_masked(database_url)}: {kind}: {exc}", ExitCode.UNAVAILABLE
            )
        if os.environ.get("DEVSCHED_DEBUG"):
            raise
        fail(f"internal: migration failed: {kind}: {exc}")
    typer.echo(f"database {_masked(database_url)} is at the latest schema")


def register(app: typer.Typer) -> None:
    """Add `up` and `migrate` to the `devsched` app (this package's `devsched.cli_plugins` entry point)."""
    app.command()(up)
    app.command()(migrate)
