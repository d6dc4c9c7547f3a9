"""Running a service until SIGTERM, and the pauses between retries.

A service is `async def main(stop: asyncio.Event) -> int`, built on an `AsyncExitStack` (nats.py's
`examples/micro/service.py`): SIGTERM or SIGINT sets `stop`, main winds down in order and returns
its exit code. A second signal cancels main outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

from devsched.core.backoff import backoff_delay

log = logging.getLogger("devsched.service")

Main = Callable[[asyncio.Event], Awaitable[int]]


def run(main: Main) -> int:
    """Run `main` in a new event loop with SIGTERM/SIGINT wired to its stop event; return its exit code."""

    async def runner() -> int:
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
        return asyncio.run(runner())
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
