"""The command line of every service: one flag per setting, `--version` and `--check-config`.

The flags come from pydantic-settings' CLI source over the service's own settings type, so `--help` lists
what that service reads and nothing else (the dashboard has no database flags). A setting `foo_bar` is
`--foo-bar` (a boolean also `--no-foo-bar`), its help names `DEVSCHED_FOO_BAR`, and a flag wins over the
variable, which wins over the default. A value that does not validate exits 2 with a line naming the
variable and the flag. Flags that are not settings (`--migrate`) are added by the service (`extend`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from devsched.service.settings import ENV_PREFIX, ProcessSettings, SettingsError
from devsched.service.version import service_version

S = TypeVar("S", bound=ProcessSettings)

#: Help of `--check-config`, the same for every program that has it.
CHECK_CONFIG_HELP = (
    "check the configuration and exit without starting: validate the settings, read every credentials and "
    "TLS file, try to reach NATS (and the database, where the program uses one) within a few seconds; one "
    "line per problem, exit 0 when there is none"
)


def flag_of(name: str) -> str:
    """`--foo-bar`, the flag of setting `foo_bar`."""
    return "--" + name.replace("_", "-")


def add_program_flags(parser: argparse.ArgumentParser, distribution: str) -> None:
    """`--version` (the installed `distribution`'s) and `--check-config`: what every devsched program has."""
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {service_version(distribution)}", help="print the version"
    )
    parser.add_argument("--check-config", action="store_true", help=CHECK_CONFIG_HELP)


def describe(error: ValidationError) -> SettingsError:
    """One line per invalid setting, naming its variable and its flag (a rule across settings: its message)."""
    lines = []
    for item in error.errors(include_url=False):
        if item["loc"]:
            name = str(item["loc"][0])
            lines.append(f"{ENV_PREFIX}{name.upper()} / {flag_of(name)}: {item['msg']}")
        else:
            lines.append(str(item["msg"]).removeprefix("Value error, "))
    return SettingsError("invalid configuration:\n  " + "\n  ".join(lines))


class CommandLine(Generic[S]):
    """The parser of one service: its settings' flags (pydantic-settings), `--version`, `--check-config`."""

    def __init__(
        self,
        settings_type: type[S],
        *,
        prog: str,
        description: str,
        distribution: str | None = None,
        extend: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> None:
        self.settings_type = settings_type
        self.parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
        add_program_flags(self.parser, distribution or prog)
        if extend is not None:
            extend(self.parser)
        # Unset flags stay out of the namespace (argparse.SUPPRESS), so the environment applies to them.
        self._source: CliSettingsSource[Any] = CliSettingsSource(
            settings_type,
            root_parser=self.parser,
            cli_kebab_case=True,
            cli_implicit_flags=True,
            cli_hide_none_type=True,
            cli_avoid_json=True,
            cli_show_env_vars=True,
        )

    def settings(self, options: argparse.Namespace) -> S:
        """Settings from the flags given in `options` over the environment; their files are readable.

        Raises:
            SettingsError: a value is invalid (the message names the variable and the flag), or a file unusable.
        """
        try:
            settings = self.settings_type(_cli_settings_source=self._source(parsed_args=options))
        except ValidationError as exc:
            raise describe(exc) from None
        settings.check_files()
        return settings

    def parse(self, argv: Sequence[str] | None) -> tuple[S, argparse.Namespace]:
        """Parse `argv` into settings and the parsed flags; exits 2 (usage error) on invalid values."""
        options = self.parser.parse_args(argv)
        try:
            return self.settings(options), options
        except SettingsError as exc:
            self.parser.error(str(exc))


def parse_settings(
    settings_type: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    distribution: str | None = None,
    extend: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[S, argparse.Namespace]:
    """`CommandLine(...).parse(argv)`: the settings and the namespace (`check_config`, `extend`'s flags)."""
    command = CommandLine(settings_type, prog=prog, description=description, distribution=distribution, extend=extend)
    return command.parse(argv)
