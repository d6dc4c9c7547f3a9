"""The `devsched` command line (typer + rich), built on `devsched.client.Client`.

`devsched --version` alone is answered here, before the commands (and the client they need) are imported.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING

from devsched.client.cli.version import version_line

if TYPE_CHECKING:
    from devsched.client.cli.common import ExitCode
    from devsched.client.cli.main import app

__all__ = ["ExitCode", "app", "main"]

_SOURCES = {"ExitCode": "devsched.client.cli.common", "app": "devsched.client.cli.main"}


def main() -> None:
    """Console entry point of `devsched`."""
    if sys.argv[1:] == ["--version"]:
        sys.stdout.write(version_line() + "\n")
        return
    from devsched.client.cli.main import main as run

    run()


def __getattr__(name: str) -> object:
    """`app` and `ExitCode`, imported the first time they are asked for."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(source), name)
    globals()[name] = value
    return value
