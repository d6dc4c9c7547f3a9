"""Bounded polling for tests: wait for a condition instead of sleeping a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

T = TypeVar("T")


# ASYNC109 wants asyncio.timeout: here `timeout` bounds the whole poll, never one predicate call.
@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    message: str = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 10.0,  # noqa: ASYNC109
    interval: float = 0.05,
    message: str = "condition",
) -> T:
    """Re-evaluate `predicate` (sync or async) until it returns a truthy value, and return that value.

    A fixed sleep is either too short on a loaded CI runner or wastes time everywhere else; a bounded
    poll is as fast as the system allows and fails with a clear message when it never happens.
    Exceptions raised by `predicate` propagate at once: an error is not "not yet".

    Raises:
        AssertionError: `predicate` stayed falsy for `timeout` seconds; the message carries the
            last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        outcome = predicate()
        value = cast(T, await outcome) if inspect.isawaitable(outcome) else outcome
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message}: still false after {timeout:.1f}s (last value: {value!r})")
        await asyncio.sleep(interval)


async def throughout(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    seconds: float,
    interval: float = 0.05,
    message: str = "condition",
) -> None:
    """Re-evaluate `predicate` for `seconds` and fail as soon as it is falsy.

    For claims that something does NOT happen (a message that must never arrive): a bounded watch of the
    window in which it would have shown, rather than one look after a guessed sleep.

    Raises:
        AssertionError: `predicate` was falsy at some point in the window.
    """
    deadline = time.monotonic() + seconds
    while True:
        outcome = predicate()
        value = cast(T, await outcome) if inspect.isawaitable(outcome) else outcome
        if not value:
            raise AssertionError(f"{message}: became false (value: {value!r})")
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(interval)
