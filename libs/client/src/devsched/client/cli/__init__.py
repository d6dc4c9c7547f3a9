"""The `devsched` command line (typer + rich), built on `devsched.client.Client`.

`devsched --version` alone is answered here, before the commands (and the client they need) are imported.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from devsched.client.cli.version import version_line
from devsched.client.lazy import lazy_attributes

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


__getattr__ = lazy_attributes(globals(), _SOURCES)
