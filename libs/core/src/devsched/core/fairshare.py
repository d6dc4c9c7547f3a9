"""Fair share per host: a bound on requests in flight and a token bucket, decided from counts and `now`.

The scheduler serves every host from one pool of request slots and database connections; without a
bound, one host that floods renewals delays every other host's renewals past their ttl and costs them
their leases. Each host gets `max_in_flight` requests at once and `rate_per_s` requests a second (with
bursts up to `burst`), plus what each of its registered devices adds (`PerDevice`, `scaled`); past
either, the request is refused at once, before it costs a transaction, with how long to wait. Pure:
`now` is a monotonic reading the caller passes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

#: The shortest pause suggested to a host that has `max_in_flight` requests running: about one
#: request's time, so a well-behaved agent retries soon after a slot frees.
MIN_RETRY_AFTER_S = 0.05


@dataclass(frozen=True, slots=True)
class ShareLimits:
    """One host's share of the scheduler.

    Raises:
        ValueError: a bound is not positive.
    """

    #: Requests of one host handled at once.
    max_in_flight: int
    #: Sustained requests per second of one host.
    rate_per_s: float
    #: Requests one host may send at once after a quiet spell (the bucket's size).
    burst: int

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.burst < 1:
            raise ValueError("max_in_flight and burst must be at least 1")
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError("rate_per_s must be a finite number above 0")


@dataclass(frozen=True, slots=True)
class PerDevice:
    """What each registered device adds to its host's share.

    A host with more devices sends more requests (a report per task, renewals, logs): a busy host of many
    devices must not be throttled like a flooding one of few.
    """

    #: Requests at once.
    in_flight: int = 0
    #: Requests per second.
    rate_per_s: float = 0.0
    #: Bucket size.
    burst: int = 0

    def __post_init__(self) -> None:
        if self.in_flight < 0 or self.burst < 0 or not (math.isfinite(self.rate_per_s) and self.rate_per_s >= 0):
            raise ValueError("what a device adds to its host's share must be finite and not negative")


def scaled(base: ShareLimits, per_device: PerDevice, devices: int) -> ShareLimits:
    """The share of a host with `devices` registered devices: `base` plus `per_device` for each."""
    n = max(devices, 0)
    if n == 0:
        return base
    return ShareLimits(
        max_in_flight=base.max_in_flight + n * per_device.in_flight,
        rate_per_s=base.rate_per_s + n * per_device.rate_per_s,
        burst=base.burst + n * per_device.burst,
    )


class Share(NamedTuple):
    """What one host has used: tokens left at `at`, and requests in flight.

    A named tuple, not a dataclass: the scheduler makes one for every request, and a flood must be cheap
    to refuse.
    """

    tokens: float
    at: float
    in_flight: int = 0

    @staticmethod
    def full(limits: ShareLimits, now: float) -> Share:
        """The share of a host not seen before (or idle long enough): a full bucket, nothing in flight."""
        return Share(tokens=float(limits.burst), at=now)

    def refilled(self, limits: ShareLimits, now: float) -> Share:
        """The share at `now`: tokens refilled at `rate_per_s`, never above `burst`.

        A clock reading older than the share's refills nothing (monotonic clocks do not go back, but the
        caller's readings may arrive out of order).
        """
        if now <= self.at:
            return self
        return Share(min(float(limits.burst), self.tokens + (now - self.at) * limits.rate_per_s), now, self.in_flight)

    def idle(self, limits: ShareLimits, now: float) -> bool:
        """Whether forgetting this share changes nothing (full bucket, nothing in flight)."""
        return self.in_flight == 0 and self.refilled(limits, now).tokens >= limits.burst


class Decision(NamedTuple):
    """The answer to one request: admitted (with the new share), or refused with a pause."""

    share: Share
    #: None when admitted; else seconds the host should wait before sending again.
    retry_after_s: float | None

    @property
    def admitted(self) -> bool:
        """Whether the request may be handled."""
        return self.retry_after_s is None


def admit(share: Share | None, limits: ShareLimits, now: float) -> Decision:
    """Admit one request of a host whose share is `share` (None: not seen before), at `now`.

    An admitted request takes a token and a slot (give the slot back with `release`); a refused one
    changes nothing, so refusals cost a flooding host its requests and nobody else anything.
    """
    current = (share or Share.full(limits, now)).refilled(limits, now)
    if current.in_flight >= limits.max_in_flight:
        return Decision(current, max(MIN_RETRY_AFTER_S, 1.0 / limits.rate_per_s))
    if current.tokens < 1.0:
        return Decision(current, max((1.0 - current.tokens) / limits.rate_per_s, 1e-3))
    return Decision(Share(current.tokens - 1.0, current.at, current.in_flight + 1), None)


def release(share: Share) -> Share:
    """The share after one of its admitted requests finished."""
    return Share(share.tokens, share.at, max(share.in_flight - 1, 0))
