"""What every command shares: global settings, exit codes, one-line errors, JSON output, the event loop.

Errors never show a traceback: a `DevschedError` becomes `error: <code>: <path>: <message>` on stderr and
the exit code of its family; anything unexpected becomes `error: internal: ...` (set `DEVSCHED_DEBUG=1`
to see the traceback instead).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from devsched.client.cli.render import visible
from devsched.client.client import DEFAULT_TIMEOUT_S, Client
from devsched.client.errors import (
    Conflict,
    DevschedError,
    InvalidRequest,
    NatsUnreachable,
    NoReply,
    NotFound,
    TooLarge,
    Unavailable,
    describe,
)
from devsched.core.status import TaskStatus
from devsched.protocol.subjects import DEFAULT_PREFIX
from devsched.protocol.tls import NatsSettings, TlsConfigError

T = TypeVar("T")


class ExitCode(IntEnum):
    """The exit codes of every `devsched` command."""

    #: Success; for `--wait` and `watch`: the task ended `done`.
    OK = 0
    #: A waited or watched task ended `failed`; `up --exit-when-done`: the demo did not end as expected;
    #: or an internal error.
    FAILED = 1
    #: Usage error, bad plan file, or a request the scheduler rejected as invalid (400, 413).
    USAGE = 2
    #: A waited or watched task ended `cancelled`.
    CANCELLED = 3
    #: No such task, host or device (404).
    NOT_FOUND = 4
    #: NATS unreachable, no scheduler answering, or the database down (503, no reply).
    UNAVAILABLE = 5
    #: The request conflicts with the task's state (409).
    CONFLICT = 6
    #: `--wait-timeout` passed before the task ended.
    TIMEOUT = 7
    #: Interrupted (Ctrl-C).
    INTERRUPTED = 130


def exit_code_of(err: DevschedError) -> ExitCode:
    """The exit code for an error, by its family."""
    if isinstance(err, InvalidRequest | TooLarge):
        return ExitCode.USAGE
    if isinstance(err, NotFound):
        return ExitCode.NOT_FOUND
    if isinstance(err, Conflict):
        return ExitCode.CONFLICT
    if isinstance(err, Unavailable | NoReply | NatsUnreachable) or err.retryable:
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED


def exit_code_of_status(status: TaskStatus | str) -> ExitCode:
    """The exit code for a task that ended in `status` (`--wait`, `watch`)."""
    return {
        TaskStatus.DONE: ExitCode.OK,
        TaskStatus.FAILED: ExitCode.FAILED,
        TaskStatus.CANCELLED: ExitCode.CANCELLED,
    }.get(TaskStatus(status), ExitCode.FAILED)


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options (`devsched --nats-url ... COMMAND`)."""

    #: NATS access, checked when connecting (a bad combination is a usage error then).
    nats: NatsSettings = field(default_factory=NatsSettings)
    prefix: str = DEFAULT_PREFIX
    timeout: float = DEFAULT_TIMEOUT_S

    async def client(self) -> Client:
        """A connected client (the caller closes it)."""
        try:
            connecting = Client.from_settings(self.nats, prefix=self.prefix, timeout=self.timeout)
        except TlsConfigError as exc:  # a credentials or TLS file: nothing was sent
            raise InvalidRequest(str(exc), errors=[{"path": "nats", "message": str(exc)}]) from None
        except ValueError as exc:  # a bad prefix
            raise InvalidRequest(f"--prefix: {exc}", errors=[{"path": "prefix", "message": str(exc)}]) from None
        return await connecting


#: Consoles: stdout for results, stderr for progress and errors (so `--json` output stays clean). Neither reads
#: markup or emoji codes in strings: what they print is built with `render.literal`, and a string that slips
#: through still prints as written.
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


def settings(ctx: typer.Context) -> Settings:
    """The global settings stored by the app's callback."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Settings) else Settings()


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Print `error: <message>` as one line on stderr (its control characters visible) and exit with `code`."""
    sys.stderr.write(f"error: {visible(' '.join(message.split()))}\n")
    sys.stderr.flush()
    raise typer.Exit(int(code))


def print_json(value: BaseModel | dict[str, Any] | list[Any]) -> None:
    """One JSON document on stdout (indented, for people who read it too)."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def print_json_line(value: BaseModel) -> None:
    """One compact JSON document on its own line (JSON Lines, for streams such as `watch --json`)."""
    sys.stdout.write(json.dumps(value.model_dump(mode="json"), separators=(",", ":")) + "\n")
    sys.stdout.flush()


def check(fn: Callable[[], T]) -> T:
    """Run a local step (read a plan file, parse an id) with the same one-line errors as `run`."""
    try:
        return fn()
    except DevschedError as exc:
        fail(describe(exc), exit_code_of(exc))


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` in a new event loop, turning every error into one line and an exit code."""
    try:
        return asyncio.run(main())
    except DevschedError as exc:
        fail(describe(exc), exit_code_of(exc))
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except Exception as exc:
        if os.environ.get("DEVSCHED_DEBUG"):
            traceback.print_exc()
        fail(f"internal: {type(exc).__name__}: {exc}", ExitCode.FAILED)


async def with_client(ctx: typer.Context, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect with the global settings, run `body(client)`, close."""
    client = await settings(ctx).client()
    async with client:
        return await body(client)
