"""The `devsched` command line: global options, and every command wired to its function."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from devsched.client.cli import artifacts as artifact_commands
from devsched.client.cli import commands
from devsched.client.cli import devices as device_commands
from devsched.client.cli import health as health_commands
from devsched.client.cli import logs as log_commands
from devsched.client.cli import resubmit as resubmit_commands
from devsched.client.cli.common import Settings
from devsched.client.cli.plugins import PluginGroup
from devsched.client.cli.version import version_line
from devsched.client.client import DEFAULT_NATS_URL, DEFAULT_TIMEOUT_S
from devsched.protocol.subjects import DEFAULT_PREFIX
from devsched.protocol.tls import NatsAccess

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
    cls=PluginGroup,
)


def _print_version(value: bool) -> None:
    if value:  # `--version` among other arguments: alone, `devsched.client.cli.main()` answers it before this app
        typer.echo(version_line())
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
        nats=NatsAccess(
            url=nats_url,
            creds=creds,
            nkey_seed=nkey_seed,
            user=user,
            password_file=password_file,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_hostname=tls_hostname,
        ),
        prefix=prefix,
        timeout=timeout,
    )


app.command()(commands.submit)
app.command()(commands.get)
app.command("ls")(commands.ls)
app.command()(commands.cancel)
app.command()(resubmit_commands.resubmit)
app.command()(commands.watch)
app.command()(log_commands.logs)
app.command()(artifact_commands.artifacts)
app.command()(commands.hosts)
app.command()(commands.drain)
app.add_typer(health_commands.app, name="health")
app.add_typer(device_commands.app, name="devices")


def main() -> None:
    """Console entry point of `devsched`."""
    app(prog_name="devsched")
