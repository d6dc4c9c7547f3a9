"""The `devsched` command line: global options, and every command wired to its function."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import typer

from devsched.client.cli import commands
from devsched.client.cli.common import ExitCode, Settings, fail
from devsched.client.cli.up_command import up
from devsched.client.client import DEFAULT_NATS_URL, DEFAULT_TIMEOUT_S
from devsched.protocol.subjects import DEFAULT_PREFIX
from devsched.protocol.tls import with_postgres_ssl

#: `DEVSCHED_DATABASE_URL`'s default, as the services have it.
DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/devsched"

EPILOG = (
    "Exit codes: 0 ok (a waited task ended done) · 1 a waited task failed, or an internal error · "
    "2 usage error or invalid request · 3 a waited task was cancelled · 4 not found · "
    "5 NATS or the scheduler unreachable · 6 conflict · 7 --wait-timeout passed · 130 interrupted."
)

app = typer.Typer(
    name="devsched",
    help="Run tasks on lab devices: submit plans, follow them, manage hosts, or bring a local stack `up`.",
    epilog=EPILOG,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
)


def client_version() -> str:
    """The installed devsched-client's version (`unknown` when run from sources that were never installed)."""
    try:
        return version("devsched-client")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"devsched {client_version()}")
        raise typer.Exit()


@app.callback()
def configure(
    ctx: typer.Context,
    nats_url: Annotated[
        str, typer.Option("--nats-url", envvar="DEVSCHED_NATS_URL", help="NATS server URL(s), comma-separated.")
    ] = DEFAULT_NATS_URL,
    prefix: Annotated[
        str, typer.Option("--prefix", envvar="DEVSCHED_SUBJECT_PREFIX", help="Subject prefix of the deployment.")
    ] = DEFAULT_PREFIX,
    creds: Annotated[
        Path | None, typer.Option("--creds", envvar="DEVSCHED_NATS_CREDS", help="NATS credentials file.")
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            envvar="DEVSCHED_TIMEOUT",
            min=0.1,
            help="Seconds to wait for each reply (and for the connection).",
        ),
    ] = DEFAULT_TIMEOUT_S,
    nkey_seed: Annotated[
        Path | None, typer.Option("--nkey-seed", envvar="DEVSCHED_NATS_NKEY_SEED", help="NATS nkey seed file.")
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", envvar="DEVSCHED_NATS_USER", help="NATS user (with --password-file).")
    ] = None,
    password_file: Annotated[
        Path | None,
        typer.Option("--password-file", envvar="DEVSCHED_NATS_PASSWORD_FILE", help="File holding the NATS password."),
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option("--tls-ca", envvar="DEVSCHED_NATS_TLS_CA", help="CA of the NATS server's certificate (TLS on)."),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", envvar="DEVSCHED_NATS_TLS_CERT", help="Client certificate for mutual TLS."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", envvar="DEVSCHED_NATS_TLS_KEY", help="Key of --tls-cert.")
    ] = None,
    tls_hostname: Annotated[
        str | None,
        typer.Option("--tls-hostname", envvar="DEVSCHED_NATS_TLS_HOSTNAME", help="Name in the server's certificate."),
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the devsched-client version and exit."
        ),
    ] = False,
) -> None:
    """Global options, read before any command."""
    ctx.obj = Settings(
        nats_url=nats_url,
        prefix=prefix,
        creds=creds,
        timeout=timeout,
        nkey_seed=nkey_seed,
        user=user,
        password_file=password_file,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_hostname=tls_hostname,
    )


app.command()(commands.submit)
app.command()(commands.get)
app.command("ls")(commands.ls)
app.command()(commands.cancel)
app.command()(commands.watch)
app.command()(commands.hosts)
app.command()(commands.drain)
app.command()(up)


def _masked(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@app.command()
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    path: Annotated[Path, typer.Option(help="The benchmark directory of a devsched source checkout.")] = Path(
        "tests/bench"
    ),
) -> None:
    """Run the benchmarks (`pytest -m bench tests/bench`) from a source checkout; extra args go to pytest.

    The benchmarks are tests of the source tree, not part of the installed package: from anywhere else this
    says how to run them.
    """
    if not path.is_dir():
        fail(
            f"no benchmarks at {path}: run `devsched bench` from a devsched source checkout (or give --path); "
            "it runs `pytest -m bench tests/bench`",
            ExitCode.USAGE,
        )
    argv = [sys.executable, "-m", "pytest", "-m", "bench", str(path), *ctx.args]
    typer.echo("running: " + " ".join(argv[1:]), err=True)
    raise typer.Exit(subprocess.call(argv))


def main() -> None:
    """Console entry point of `devsched`."""
    app(prog_name="devsched")
