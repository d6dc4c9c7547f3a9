"""The agent's lease clock: when to renew and when to give up, from `ttl_s` and the monotonic clock.

The database expires a lease `ttl_s` after it processed the last claim or renewal. The agent cannot see
that moment, but it knows when it SENT the request, which is earlier; so `sent_at + ttl_s` on its own
monotonic clock is a deadline that always falls before the database's expiry (ARCHITECTURE invariant 9:
never compare wall clocks). Past the deadline the lease counts as lost and no step starts. Renewals are
due at about a third of the ttl, which leaves two more tries before the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: When the next renewal is due, as a fraction of the ttl after the last successful request was sent.
RENEW_FRACTION = 1 / 3


@dataclass(frozen=True, slots=True)
class Schedule:
    """Monotonic times derived from one successful request."""

    #: When the next renewal is due.
    next_renewal: float
    #: When the lease counts as lost unless a later renewal succeeded.
    deadline: float


def schedule(sent_at: float, ttl_s: float, *, fraction: float = RENEW_FRACTION, margin_s: float = 0.0) -> Schedule:
    """The renewal time and local deadline for a request sent at `sent_at` and granted `ttl_s`.

    `margin_s` moves the deadline earlier (never before `sent_at`); the renewal always falls between
    `sent_at` and the deadline.
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    deadline = sent_at + max(ttl_s - max(margin_s, 0.0), 0.0)
    return Schedule(next_renewal=sent_at + (deadline - sent_at) * fraction, deadline=deadline)


class LeaseClock:
    """The live schedule of one lease, fed with every successful claim or renewal."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        fraction: float = RENEW_FRACTION,
        margin_s: float = 0.0,
    ) -> None:
        self._clock = clock
        self._fraction = fraction
        self._margin_s = margin_s
        self._current: Schedule | None = None
        self._ttl_s: float | None = None

    def now(self) -> float:
        """The monotonic time, from the injected clock."""
        return self._clock()

    def grant(self, sent_at: float, ttl_s: float) -> None:
        """Record a successful request sent at `sent_at` that granted `ttl_s`.

        A reply to an older request that arrives late never moves the deadline backwards.
        """
        new = schedule(sent_at, ttl_s, fraction=self._fraction, margin_s=self._margin_s)
        if self._current is None or new.deadline >= self._current.deadline:
            self._current, self._ttl_s = new, ttl_s

    @property
    def ttl_s(self) -> float | None:
        """The ttl of the latest grant, if any."""
        return self._ttl_s

    @property
    def interval_s(self) -> float | None:
        """Seconds from a successful request to the renewal it makes due; None before the first grant."""
        if self._ttl_s is None:
            return None
        return max(self._ttl_s - max(self._margin_s, 0.0), 0.0) * self._fraction

    @property
    def deadline(self) -> float | None:
        """Monotonic time after which the lease counts as lost; None before the first grant."""
        return None if self._current is None else self._current.deadline

    @property
    def next_renewal(self) -> float | None:
        """Monotonic time when the next renewal is due; None before the first grant."""
        return None if self._current is None else self._current.next_renewal

    def live(self, now: float | None = None) -> bool:
        """Whether the lease still counts as held (granted, and the deadline not reached)."""
        now = self.now() if now is None else now
        return self._current is not None and now < self._current.deadline

    def remaining(self, now: float | None = None) -> float:
        """Seconds until the deadline (0 when past it or never granted)."""
        now = self.now() if now is None else now
        return 0.0 if self._current is None else max(self._current.deadline - now, 0.0)

    def until_renewal(self, now: float | None = None) -> float:
        """Seconds until the next renewal is due (0 when due or never granted)."""
        now = self.now() if now is None else now
        return 0.0 if self._current is None else max(self._current.next_renewal - now, 0.0)
