"""The collaborative stop of one attempt: why it stopped, and how hard.

The renewal side (and the agent's shutdown) requests stops; the runner reads them at step boundaries and
hands each running step an interrupt that fires at the level that step yields to:

| level | set by | no new step of kind | running steps interrupted |
| --- | --- | --- | --- |
| `STOP` | cancellation or time limit (renewal reply); shutdown | planned (not `always`) | interruptible, not `always` |
| `HALT` | lease lost (409, or no renewal within the ttl) | any, `always` included | interruptible |
| `KILL` | the end of the shutdown grace | any | every step |

The FIRST reason is what the run reports (`cancelled` only for a cancellation; a time limit `failed`, with
the limit, `attempt_timeout` or `deadline_exceeded`, as its reason; a shutdown gives the attempt back,
`release`); a later halt still halts, and is mentioned in the report's reason. A shutdown holds the lease,
so its teardown (`always`) steps run, as after a cancellation; they never run after a lease loss.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum, StrEnum


class StopReason(StrEnum):
    """Why a run was told to stop."""

    #: Not stopped.
    NONE = "none"
    #: A renewal reply said a cancellation is pending.
    CANCELLED = "cancelled"
    #: A renewal was rejected (409), or none succeeded before the lease's local deadline.
    LEASE_LOST = "lease_lost"
    #: The agent is shutting down: teardown steps run, then the attempt is given back (released).
    SHUTDOWN = "shutdown"
    #: A renewal reply said the attempt ran past a time limit (`stop`): teardown runs, the run reports failed.
    TIMEOUT = "timeout"


class StopLevel(IntEnum):
    """How hard a run is stopped (see the module table)."""

    NONE = 0
    STOP = 1
    HALT = 2
    KILL = 3


_LEVEL_OF = {
    StopReason.CANCELLED: StopLevel.STOP,
    StopReason.LEASE_LOST: StopLevel.HALT,
    StopReason.SHUTDOWN: StopLevel.STOP,
    StopReason.TIMEOUT: StopLevel.STOP,
}


class StopSignal:
    """The stop state of one attempt; set from any task of the agent's event loop."""

    def __init__(self) -> None:
        self._reason = StopReason.NONE
        self._detail = ""
        self._level = StopLevel.NONE
        self._halt: tuple[StopReason, str] | None = None
        self._watchers: list[tuple[StopLevel, asyncio.Event]] = []

    @property
    def reason(self) -> StopReason:
        """The first reason given: what the run reports."""
        return self._reason

    @property
    def detail(self) -> str:
        """Free text given with the first reason."""
        return self._detail

    @property
    def level(self) -> StopLevel:
        """The highest level requested so far."""
        return self._level

    @property
    def stopped(self) -> bool:
        """Whether no further planned step may start."""
        return self._level >= StopLevel.STOP

    @property
    def halted(self) -> bool:
        """Whether no step at all may start: the lease is lost, or the shutdown grace is over."""
        return self._level >= StopLevel.HALT

    @property
    def halt(self) -> tuple[StopReason, str] | None:
        """The first reason (and detail) that halted the run, if any."""
        return self._halt

    def request(self, reason: StopReason, detail: str = "") -> None:
        """Stop for `reason`; a later request may raise the level but never changes the first reason."""
        if reason is StopReason.NONE:
            raise ValueError("cannot request a stop for no reason")
        if self._reason is StopReason.NONE:
            self._reason, self._detail = reason, detail
        level = _LEVEL_OF[reason]
        if level >= StopLevel.HALT and self._halt is None:
            self._halt = (reason, detail)
        self._raise_to(level)

    def kill(self, detail: str = "shutdown grace period over") -> None:
        """Interrupt every running step, interruptible or not, and start no other (teardown included)."""
        self.request(StopReason.SHUTDOWN, detail)
        if self._halt is None:
            self._halt = (StopReason.SHUTDOWN, detail)
        self._raise_to(StopLevel.KILL)

    def _raise_to(self, level: StopLevel) -> None:
        if level <= self._level:
            return
        self._level = level
        for threshold, event in self._watchers:
            if level >= threshold:
                event.set()

    @contextmanager
    def interrupt(self, threshold: StopLevel) -> Iterator[asyncio.Event]:
        """An event that is set once the level reaches `threshold` (at once if it already has)."""
        if threshold is StopLevel.NONE:
            raise ValueError("threshold must be a stop level")
        event = asyncio.Event()
        if self._level >= threshold:
            event.set()
        watcher = (threshold, event)
        self._watchers.append(watcher)
        try:
            yield event
        finally:
            self._watchers.remove(watcher)

    async def wait(self, threshold: StopLevel = StopLevel.STOP) -> None:
        """Return once the level reaches `threshold`."""
        with self.interrupt(threshold) as event:
            await event.wait()
