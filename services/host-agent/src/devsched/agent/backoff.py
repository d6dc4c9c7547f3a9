"""Capped exponential backoff with jitter, for retrying requests to the control plane."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator


def backoff_delay(
    failures: int,
    *,
    base_s: float = 0.2,
    cap_s: float = 30.0,
    random_fraction: Callable[[], float] = random.random,
) -> float:
    """The delay before retry number `failures` (1 for the first retry).

    The ceiling doubles from `base_s` up to `cap_s`; the delay is drawn from its upper half ("equal
    jitter"), so retries of many agents spread out but never come back at once.
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if not 0 < base_s <= cap_s:
        raise ValueError(f"need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
    ceiling = cap_s if failures > 64 else min(cap_s, base_s * 2 ** (failures - 1))
    return ceiling / 2 + ceiling / 2 * random_fraction()


def backoff_delays(
    *, base_s: float = 0.2, cap_s: float = 30.0, random_fraction: Callable[[], float] = random.random
) -> Iterator[float]:
    """An endless series of retry delays (see `backoff_delay`)."""
    failures = 0
    while True:
        failures += 1
        yield backoff_delay(failures, base_s=base_s, cap_s=cap_s, random_fraction=random_fraction)
