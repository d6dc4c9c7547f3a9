"""Capped exponential backoff with jitter: the one formula every retry in devsched uses.

Agents retrying their requests, clients retrying a request with no answer, and the services' loops waiting
for Postgres or NATS all pause by `backoff_delay`, so a change to how devsched backs off is made here once.
Pure: the random draw is a parameter (tests pass a fixed one).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

from devsched.core.errors import TooManyRequests

#: The longest pause a 429 may impose: a scheduler asking for more is not trusted beyond it.
MAX_RETRY_AFTER_S = 60.0


def backoff_ceiling(failures: int, *, base_s: float, cap_s: float, multiplier: float = 2.0) -> float:
    """The longest delay before retry number `failures` (1 for the first): `base_s * multiplier**(n-1)`, capped.

    A task's retry policy waits exactly this long (`devsched.core.retrying`); requests wait a jittered part
    of it (`backoff_delay`).
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if not 0 < base_s <= cap_s:
        raise ValueError(f"need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
    if not multiplier >= 1:
        raise ValueError(f"need multiplier >= 1, got {multiplier}")
    if multiplier == 1:
        return base_s
    # past the cap, the power would only overflow: log(cap/base) / log(multiplier) steps reach it
    if failures - 1 >= math.log(cap_s / base_s) / math.log(multiplier) + 1:
        return cap_s
    return min(cap_s, base_s * multiplier ** (failures - 1))


def backoff_delay(
    failures: int,
    *,
    base_s: float = 0.2,
    cap_s: float = 30.0,
    random_fraction: Callable[[], float] = random.random,
) -> float:
    """The delay before retry number `failures` (1 for the first retry).

    The ceiling doubles from `base_s` up to `cap_s` (`backoff_ceiling`); the delay is drawn from its upper
    half ("equal jitter"), so retries of many agents spread out but never come back at once.
    """
    ceiling = backoff_ceiling(failures, base_s=base_s, cap_s=cap_s)
    return ceiling / 2 + ceiling / 2 * random_fraction()


def backoff_delays(
    *, base_s: float = 0.2, cap_s: float = 30.0, random_fraction: Callable[[], float] = random.random
) -> Iterator[float]:
    """An endless series of retry delays (see `backoff_delay`)."""
    failures = 0
    while True:
        failures += 1
        yield backoff_delay(failures, base_s=base_s, cap_s=cap_s, random_fraction=random_fraction)


def retry_after(exc: BaseException) -> float:
    """The pause the scheduler asked for with 429 `too_many_requests` (`details.retry_after_s`), else 0.

    Callers wait at least this long before sending again: retrying sooner only earns another 429.
    """
    if not isinstance(exc, TooManyRequests):
        return 0.0
    value = exc.details.get("retry_after_s")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return 0.0
    return min(float(value), MAX_RETRY_AFTER_S)
