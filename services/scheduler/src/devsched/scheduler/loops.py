"""Background loops that are woken by events and by a periodic tick, and back off on failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from devsched.core.errors import DevschedError
from devsched.service import Backoff, sleep_or_stop

log = logging.getLogger("devsched.scheduler.loops")

#: One pass of a loop; returns True when there is more work to do at once (a full batch).
Step = Callable[[], Awaitable[bool]]


class Wakeup:
    """A coalescing wake-up: any number of `set()` calls during a pass cause exactly one more pass."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """Ask for a pass soon."""
        self._event.set()

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109 - the tick is the point
        """Wait for a `set()` or for `timeout` seconds, whichever comes first, then re-arm."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()


class WorkLoop:
    """Runs `step` whenever woken (or every `tick` seconds), again at once while it reports more work.

    A failure is logged and followed by a jittered, growing pause: replicas that all saw the database
    go away do not hammer it in lockstep when it comes back.
    """

    def __init__(self, name: str, step: Step, wakeup: Wakeup, *, tick: float) -> None:
        self.name = name
        self._step = step
        self._wakeup = wakeup
        self._tick = tick
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0

    def start(self) -> None:
        """Start the loop as a task."""
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Let the current pass finish, then end the loop."""
        self._stop.set()
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        backoff = Backoff(base=0.1, cap=5.0)
        while not self._stop.is_set():
            try:
                more = await self._step()
            except DevschedError as exc:
                delay = backoff.next()
                log.warning(
                    "%s pass failed: %s", self.name, exc.message, extra={"error": exc.code, "retry_in_s": delay}
                )
                await sleep_or_stop(self._stop, delay)
                continue
            except Exception as exc:  # a transport error, or a bug: keep the loop alive either way
                delay = backoff.next()
                log.warning(
                    "%s pass failed: %s",
                    self.name,
                    f"{type(exc).__name__}: {exc}",
                    exc_info=not _is_transport_error(exc),
                    extra={"retry_in_s": delay},
                )
                await sleep_or_stop(self._stop, delay)
                continue
            self.passes += 1
            backoff.reset()
            if more:
                await asyncio.sleep(0)  # let requests in between batches
                continue
            await self._wakeup.wait(self._tick)


def _is_transport_error(exc: Exception) -> bool:
    import nats.errors

    return isinstance(exc, nats.errors.Error | TimeoutError | ConnectionError)
