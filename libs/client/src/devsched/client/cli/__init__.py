"""The `devsched` command line (typer + rich), built on `devsched.client.Client`."""

from devsched.client.cli.common import ExitCode
from devsched.client.cli.main import app, main

__all__ = ["ExitCode", "app", "main"]
