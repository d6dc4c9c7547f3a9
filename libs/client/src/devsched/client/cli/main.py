"""The `devsched` command line: global options, and every command wired to its function."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Annotated

import typer
from typer.models import CommandInfo

from devsched.client.cli import artifacts as artifact_commands
from devsched.client.cli import commands
from devsched.client.cli import devices as device_commands
from devsched.client.cli import health as health_commands
from devsched.client.cli import logs as log_commands
from devsched.client.cli.common import ExitCode, Settings, fail
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
app.command()(commands.watch)
app.command()(log_commands.logs)
app.command()(artifact_commands.artifacts)
app.command()(commands.hosts)
app.command()(commands.drain)
app.add_typer(health_commands.app, name="health")
app.add_typer(device_commands.app, name="devices")


#: Entry point group of the packages that add commands to `devsched`: each names a `register(app)` function.
PLUGIN_GROUP = "devsched.cli_plugins"

#: Commands that come with a package of their own, and that package: without it, they say so in one line.
PLUGIN_COMMANDS = {"up": "devsched-devstack", "migrate": "devsched-devstack", "bench": "devsched-bench"}


def _missing(name: str, package: str) -> Callable[[], None]:
    def command() -> None:
        fail(f"`devsched {name}` comes with the {package} package: install it (pip install {package})", ExitCode.USAGE)

    command.__doc__ = f"(not installed: `pip install {package}` adds it)"
    return command


def _load_plugins() -> None:
    """Add the commands of the installed plugin packages, and a one-line hint for each one that is missing.

    The client stays installable without the server side: `devsched up` and `devsched migrate` need the store, the
    embedded servers and asyncpg, which live in devsched-devstack, and `devsched bench` lives in devsched-bench;
    both register themselves through `PLUGIN_GROUP`.
    """
    for entry in entry_points(group=PLUGIN_GROUP):
        register: Callable[[typer.Typer], None] = entry.load()
        register(app)
    present = {_name(command) for command in app.registered_commands if command.callback is not None}
    for name, package in PLUGIN_COMMANDS.items():
        if name not in present:
            app.command(
                name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False
            )(_missing(name, package))
    # `--help` lists them in PLUGIN_COMMANDS's order, whatever order the packages were found in.
    order = {name: index for index, name in enumerate(PLUGIN_COMMANDS)}
    app.registered_commands.sort(key=lambda command: order.get(_name(command), -1))


def _name(command: CommandInfo) -> str:
    if command.name is not None:
        return command.name
    return command.callback.__name__.replace("_", "-") if command.callback is not None else ""


_load_plugins()


def main() -> None:
    """Console entry point of `devsched`."""
    app(prog_name="devsched")
