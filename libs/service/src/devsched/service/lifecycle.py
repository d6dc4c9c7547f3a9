"""Running a service until SIGTERM, and the pauses between retries.

A service is `async def main(stop: asyncio.Event) -> int`, built on an `AsyncExitStack` (nats.py's
`examples/micro/service.py`): SIGTERM or SIGINT sets `stop`, main winds down in order and returns
its exit code. A second signal cancels main outright.

The loop is asyncio's own unless `DEVSCHED_EVENT_LOOP` says `uvloop` (insists on it) or `auto` (uvloop's
where it imports: a dependency of this package on Linux and macOS). uvloop is cheaper per message in
micro-benchmarks of asyncpg and nats-py, but `devsched bench --only renewals` measured the scheduler's
renewals dearer on it (0.78 against 0.67 ms of scheduler and Postgres CPU each, two interleaved pairs), so
it is not the default (`event_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from devsched.core.backoff import backoff_delay

log = logging.getLogger("devsched.service")

T = TypeVar("T")
Main = Callable[[asyncio.Event], Awaitable[int]]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]

#: The environment variable that picks the event loop: `asyncio` (the default), `auto` or `uvloop`.
EVENT_LOOP_ENV = "DEVSCHED_EVENT_LOOP"
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


class EventLoopError(RuntimeError):
    """`DEVSCHED_EVENT_LOOP` names no loop, or one that cannot be had here."""


def event_loop(environ: Mapping[str, str] = os.environ) -> tuple[str, LoopFactory | None]:
    """The services' event loop, named, as `DEVSCHED_EVENT_LOOP` asks, and its factory for `asyncio.Runner`.

    `asyncio` (or unset): asyncio's; `auto`: uvloop's where it imports, else asyncio's; `uvloop`:
    uvloop's or an error. asyncio's factory is None: the runner's own default, as `asyncio.run`.

    Raises:
        EventLoopError: an unknown name, or `uvloop` where it does not import.
    """
    choice = environ.get(EVENT_LOOP_ENV, "").strip().lower() or "asyncio"
    if choice not in EVENT_LOOPS:
        raise EventLoopError(f"{EVENT_LOOP_ENV}={choice!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop  # optional: where it is missing, asyncio's loop serves
    except ImportError as exc:
        if choice == "uvloop":
            raise EventLoopError(f"{EVENT_LOOP_ENV}=uvloop, but uvloop does not import: {exc}") from exc
        return "asyncio", None
    factory: LoopFactory = uvloop.new_event_loop
    return "uvloop", factory


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on a new loop of `event_loop()`, as `asyncio.run` does on asyncio's.

    Raises:
        EventLoopError: `DEVSCHED_EVENT_LOOP` cannot be honoured.
    """
    _, factory = event_loop()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def run(main: Main) -> int:
    """Run `main` in a new event loop with SIGTERM/SIGINT wired to its stop event; return its exit code.

    Returns 2 (logged) when `DEVSCHED_EVENT_LOOP` cannot be honoured.
    """
    try:
        name, factory = event_loop()
    except EventLoopError as exc:
        log.error("%s", exc)
        return 2

    async def runner() -> int:
        log.info("event loop", extra={"event_loop": name})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: signal.Signals) -> None:
            if stop.is_set():
                log.warning("second %s: stopping at once", signum.name)
                task.cancel()
                return
            log.info("%s received: shutting down", signum.name, extra={"signal": signum.name})
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            return await main(stop)
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)

    try:
        with asyncio.Runner(loop_factory=factory) as loop_runner:
            return loop_runner.run(runner())
    except asyncio.CancelledError:
        return 130


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` unless `stop` is set first; returns True when stopped."""
    if stop.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


class Backoff:
    """Exponential pauses with jitter (`devsched.core.backoff`), reset after a success.

    The jitter keeps replicas that failed together (the database went away for all of them) from
    retrying in lockstep when it returns.
    """

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """The pause before the next try; each call counts one more failure."""
        self.failures += 1
        return backoff_delay(self.failures, base_s=self.base, cap_s=max(self.cap, self.base))

    def reset(self) -> None:
        """Start again from the base after a success."""
        self.failures = 0
