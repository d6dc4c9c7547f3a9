"""The commands that other packages add to `devsched` (`up`, `migrate`, `bench`), loaded when they are used.

A plug-in package names a `register(app)` function in the `devsched.cli_plugins` entry point group; `register`
adds its commands to the Typer app it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import typer
from typer._click import Command  # typer's own copy of click: the type its groups hold
from typer.core import TyperGroup

from devsched.client.cli.common import ExitCode, fail

#: Entry point group of the packages that add commands to `devsched`: each names a `register(app)` function.
PLUGIN_GROUP = "devsched.cli_plugins"

#: Commands that come with a package of their own, and that package: without it, they say so in one line.
PLUGIN_COMMANDS = {"up": "devsched-devstack", "migrate": "devsched-devstack", "bench": "devsched-bench"}


def _missing(name: str, package: str) -> Callable[[], None]:
    def command() -> None:
        fail(f"`devsched {name}` comes with the {package} package: install it (pip install {package})", ExitCode.USAGE)

    command.__doc__ = f"(not installed: `pip install {package}` adds it)"
    return command


def _package_of(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return "" if dist is None else str(dist.name).lower().replace("_", "-")


class PluginGroup(TyperGroup):
    """The `devsched` group: the client's own commands at once, the plug-ins' commands when first named or listed.

    The client stays installable and quick without the server side: `devsched up` and `devsched migrate` need the
    store, the embedded servers and asyncpg, which live in devsched-devstack, and `devsched bench` lives in
    devsched-bench; both register themselves through `PLUGIN_GROUP`. Loading a plug-in imports its package, so
    it happens only when one of its commands runs (or its help is asked), or when every command is listed
    (`devsched --help`, completion); `devsched ls` never loads one. A plug-in command that is not installed gets
    a one-line hint instead.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._loaded: set[str] = set()  # the entry points already registered, by `group:name=value`

    def get_command(self, ctx: Any, cmd_name: str) -> Command | None:  # noqa: D102 (a click override)
        command = self.commands.get(cmd_name)
        if command is None:
            self._load(PLUGIN_COMMANDS.get(cmd_name))
            command = self.commands.get(cmd_name)
        return command

    def list_commands(self, ctx: Any) -> list[str]:  # noqa: D102 (a click override)
        self._load(None)
        # The plug-ins' commands after the client's own, in PLUGIN_COMMANDS's order whatever order they came in.
        names = list(self.commands)
        order = {name: index for index, name in enumerate(PLUGIN_COMMANDS)}
        return sorted(names, key=lambda name: order.get(name, -1))

    def _load(self, package: str | None) -> None:
        """Register the plug-ins of `package` (every plug-in when None or when it has none), then the hints."""
        found = list(entry_points(group=PLUGIN_GROUP))
        chosen = [entry for entry in found if _package_of(entry) == package] or found
        for entry in chosen:
            key = f"{entry.group}:{entry.name}={entry.value}"
            if key in self._loaded:
                continue
            self._loaded.add(key)
            scratch = typer.Typer(rich_markup_mode=None, add_completion=False)
            register: Callable[[typer.Typer], None] = entry.load()
            register(scratch)
            for name, command in typer.main.get_group(scratch).commands.items():
                self.commands.setdefault(name, command)
        if len(chosen) < len(found):
            return  # the other plug-ins are not asked for: their commands' names are not known yet
        hints = typer.Typer(rich_markup_mode=None, add_completion=False)
        for name, needed in PLUGIN_COMMANDS.items():
            if name not in self.commands:
                hints.command(
                    name,
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                    add_help_option=False,
                )(_missing(name, needed))
        if hints.registered_commands:
            self.commands.update(typer.main.get_group(hints).commands)
