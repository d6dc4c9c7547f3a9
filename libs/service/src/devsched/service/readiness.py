"""Readiness: the named checks of a service, evaluated together, bounded and cached (`/readyz` serves them).

`NotReady` is how a check says why it fails; `check_nats` and `plainly` are the checks and the adapter
every service shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

#: Longest reason kept from a failing check.
MAX_REASON_CHARS = 300


class NotReady(Exception):
    """A readiness check failed; the message says why (shown in `/readyz`'s body)."""


#: A readiness check: returns when it passes, raises (`NotReady` with a reason, or any error) when not.
Check = Callable[[], Awaitable[None]]


def reason_of(exc: BaseException) -> str:
    """One bounded line saying why a check failed: its message, or the error's type and message."""
    if isinstance(exc, NotReady):
        text = str(exc)
    else:
        message = str(exc).strip()
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one evaluation of every check: the reason of each failing one."""

    failing: Mapping[str, str]
    passing: tuple[str, ...]
    at: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        """Whether every check passed."""
        return not self.failing

    def to_json(self) -> dict[str, Any]:
        """`{"ready": ..., "checks": {name: {"ok": true} | {"ok": false, "error": why}}}`."""
        checks: dict[str, dict[str, Any]] = {name: {"ok": True} for name in self.passing}
        checks.update({name: {"ok": False, "error": why} for name, why in self.failing.items()})
        return {"ready": self.ready, "checks": dict(sorted(checks.items()))}


class Readiness:
    """The named checks of one service, evaluated together and cached briefly."""

    def __init__(self, *, cache_s: float = 1.0, check_timeout_s: float = 3.0) -> None:
        self.cache_s = cache_s
        self.check_timeout_s = check_timeout_s
        self._checks: dict[str, Check] = {}
        self._last: Verdict | None = None
        self._running: asyncio.Future[Verdict] | None = None

    def add(self, name: str, check: Check) -> None:
        """Register `check` under `name` (a name used once)."""
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is registered already")
        self._checks[name] = check
        self._last = None

    @property
    def names(self) -> tuple[str, ...]:
        """The registered checks, in registration order."""
        return tuple(self._checks)

    async def verdict(self) -> Verdict:
        """Every check's outcome, evaluated at most once per `cache_s` (concurrent callers share one run)."""
        last = self._last
        if last is not None and time.monotonic() - last.at < self.cache_s:
            return last
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._evaluate())
        # shielded: a probe that hangs up must not cancel the evaluation other probes wait for
        return await asyncio.shield(self._running)

    async def _evaluate(self) -> Verdict:
        names = list(self._checks)
        outcomes = await asyncio.gather(*(self._run(self._checks[name]) for name in names))
        failing = {name: why for name, why in zip(names, outcomes, strict=True) if why is not None}
        verdict = Verdict(failing=failing, passing=tuple(n for n in names if n not in failing))
        self._last = verdict
        return verdict

    async def _run(self, check: Check) -> str | None:
        try:
            async with asyncio.timeout(self.check_timeout_s):
                await check()
        except TimeoutError:
            return f"no answer within {self.check_timeout_s:g} s"
        except Exception as exc:  # a check's failure is its verdict, whatever it raised
            return reason_of(exc)
        return None


async def check_nats(nc: Client | None, timeout: float = 2.0) -> None:  # noqa: ASYNC109
    """Pass when `nc` is connected and the server answers a PING (a flag alone can hide a dead socket).

    Raises:
        NotReady: not connected (yet, or any more), or no PONG within `timeout`.
    """
    if nc is None:
        raise NotReady("not connected yet")
    if not nc.is_connected:
        state = "closed" if nc.is_closed else "draining" if nc.is_draining else "reconnecting"
        raise NotReady(f"not connected ({state})")
    try:
        await nc.flush(timeout=timeout)  # type: ignore[arg-type]  # nats-py annotates it int
    except Exception as exc:
        raise NotReady(f"no answer from the server: {type(exc).__name__}") from None


async def plainly(work: Awaitable[None], *errors: type[Exception]) -> None:
    """Await `work`; an error of the types given fails the check with its message alone.

    For errors whose message is a whole sentence (the store's `DatabaseNotReady`): their type name adds nothing.
    """
    try:
        await work
    except errors as exc:
        raise NotReady(str(exc)) from None
