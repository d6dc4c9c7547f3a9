"""`--check-config`: what a program would meet at start, checked without starting it.

Each check is a name and a coroutine that returns what it found or raises `CheckFailed` with one line.
`run_checks` runs them in order, each bounded, and prints one line per check: `ok <name>: ...` on stdout,
`<prog>: <name>: ...` on stderr for a problem; exit code 0 when none failed, 1 otherwise. Nothing is
started, registered or written.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from nats.aio.client import Client

from devsched.protocol.connection import connect
from devsched.protocol.tls import NatsSettings, TlsConfigError

#: Seconds a check may take (a NATS server or a database that does not answer within it is a problem).
CHECK_TIMEOUT_S = 5.0


class CheckFailed(Exception):
    """A check found a problem; the message is one line that says what and, where it can, what to do."""


@dataclass(frozen=True, slots=True)
class Check:
    """One thing `--check-config` looks at."""

    #: What is checked, as the line names it (`NATS`, `database`, `spool_dir`).
    name: str
    #: Returns what it found (one line); raises `CheckFailed` (or one of `failures`) with the problem.
    run: Callable[[], Awaitable[str]]
    #: Other exceptions that report a problem in one line (`DatabaseNotReady`), as `CheckFailed` does.
    failures: tuple[type[Exception], ...] = ()


def passed(name: str, found: str) -> Check:
    """A check already done (the settings, validated as they were parsed): its line only."""

    async def done() -> str:
        return found

    return Check(name, done)


async def reach_nats(settings: NatsSettings, *, name: str, host_id: str | None = None) -> str:
    """Read the credentials and TLS files, connect as the program would (`protocol.connection`), round-trip.

    Raises:
        CheckFailed: a file is unusable, or no server accepted the connection within `CHECK_TIMEOUT_S`
            (with the last error the client met: refused, authorization violation, certificate).
    """
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(f"{type(exc).__name__}: {exc}".rstrip(": "))

    try:
        settings.check()  # every credentials and TLS file, read before anything is sent
    except TlsConfigError as exc:
        raise CheckFailed(str(exc)) from None
    nc = Client()
    servers = ", ".join(settings.servers)
    try:
        await asyncio.wait_for(
            connect(nc, settings, name=name, drain_timeout_s=1.0, host_id=host_id, error_cb=on_error),
            CHECK_TIMEOUT_S,
        )
        await nc.flush(timeout=int(CHECK_TIMEOUT_S))
        info = nc._server_info
        return f"connected to {servers} (nats-server {info.get('version', '?')})"
    except TlsConfigError as exc:
        raise CheckFailed(str(exc)) from None
    except TimeoutError:
        why = f": {errors[-1]}" if errors else ""
        raise CheckFailed(f"no connection to {servers} within {CHECK_TIMEOUT_S:g} s{why}") from None
    except Exception as exc:  # nats-py's errors have no common root worth naming
        raise CheckFailed(f"cannot connect to {servers}: {type(exc).__name__}: {exc}") from None
    finally:
        await nc.close()


async def _bounded(check: Check) -> str:
    try:
        return await asyncio.wait_for(check.run(), CHECK_TIMEOUT_S * 2)
    except TimeoutError:
        raise CheckFailed(f"no answer within {CHECK_TIMEOUT_S * 2:g} s") from None


def run_checks(prog: str, checks: Sequence[Check], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run `checks` in order, one line each; 0 when every one passed, 1 otherwise."""
    out = out or sys.stdout
    err = err or sys.stderr

    async def run_all() -> int:
        failed = 0
        for check in checks:
            failures: tuple[type[Exception], ...] = (CheckFailed, *check.failures)
            try:
                found = await _bounded(check)
            except failures as exc:
                failed += 1
                print(f"{prog}: {check.name}: {exc}", file=err, flush=True)
            else:
                print(f"ok {check.name}: {found}", file=out, flush=True)
        return 1 if failed else 0

    return asyncio.run(run_all())


def check_config(prog: str, settings: NatsSettings, *more: Check) -> int:
    """`--check-config` of a service whose settings parsed (valid, files read): NATS, then `more`; the exit code."""
    checks = [
        passed("settings", "valid; every credentials and TLS file read"),
        Check("NATS", lambda: reach_nats(settings, name=f"{prog}-check")),
        *more,
    ]
    return run_checks(prog, checks)
