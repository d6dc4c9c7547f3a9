"""A host's output rate share: how much it wrote into its logs stream over a window, and whether that is too much.

Every record a host stores costs the shared JetStream store a write (and, with `sync_interval: always`, an
fsync): a host writing records as fast as NATS takes them slows every other host's and the scheduler's
writes, while the byte share alone only bounds what it keeps. So each host may also write at most
`records_per_s * window_s` records and `bytes_per_s * window_s` bytes in any `window_s` seconds (a burst
is fine as long as the window's total stays within it); past either, its logs stream is closed to new
records for `cooldown_s`.

What was written is read from the stream's state alone (no work per record): the records are the growth of
its last sequence; the bytes are the growth of its size plus what it dropped meanwhile (its own oldest
records, once at its byte share), each dropped record counted at the stream's mean record size then.

Pure: `at` is a monotonic reading the caller takes, never read here.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutputShare:
    """One host's share of the logs' write rate.

    Raises:
        ValueError: a bound is not a finite number above 0, or the cool-down is shorter than the window.
    """

    #: Records a second, averaged over `window_s`.
    records_per_s: float
    #: Bytes a second, averaged over `window_s`.
    bytes_per_s: float
    #: The window the rates are averaged over, in seconds.
    window_s: float
    #: How long a host over its share has its logs closed, in seconds. At least `window_s`: when the stream
    #: reopens, the window then holds nothing of the flood that closed it, so no replica closes it again
    #: for what was already paid for.
    cooldown_s: float

    def __post_init__(self) -> None:
        for name in ("records_per_s", "bytes_per_s", "window_s", "cooldown_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number above 0")
        if self.cooldown_s < self.window_s:
            raise ValueError("cooldown_s must be at least window_s")

    @property
    def max_records(self) -> float:
        """Records a host may write in one window."""
        return self.records_per_s * self.window_s

    @property
    def max_bytes(self) -> float:
        """Bytes a host may write in one window."""
        return self.bytes_per_s * self.window_s


@dataclass(frozen=True, slots=True)
class Reading:
    """A logs stream's state at one moment (JetStream's stream info)."""

    #: When it was read (a monotonic clock, in seconds).
    at: float
    #: The stream's last sequence: one more for each record stored.
    last_seq: int
    #: Records it holds.
    messages: int
    #: Bytes it holds.
    bytes: int


@dataclass(frozen=True, slots=True)
class Written:
    """What a host wrote between two readings."""

    records: int
    bytes: int


def written(before: Reading, after: Reading) -> Written | None:
    """What was stored between `before` and `after`; None when the stream was made anew in between.

    The bytes of the records dropped meanwhile (`before.messages + records - after.messages` of them) are
    not in the stream's state: each is counted at the mean record size of `before`, which held them.
    """
    records = after.last_seq - before.last_seq
    if records < 0:
        return None  # another stream under the same name: the readings do not compare
    dropped = max(0, before.messages + records - after.messages)
    mean = before.bytes / before.messages if before.messages else 0.0
    size = max(0, after.bytes - before.bytes + round(dropped * mean))
    return Written(records=records, bytes=size)


class RateWindow:
    """The readings of one host's logs stream over the last window, and whether it wrote past its share."""

    __slots__ = ("_readings", "share")

    def __init__(self, share: OutputShare) -> None:
        self.share = share
        self._readings: deque[Reading] = deque()

    def add(self, reading: Reading) -> Written | None:
        """Take a reading; what the host wrote within the window when that is past its share, else None.

        The total runs from the oldest reading within the window: it covers the window less at most one
        reading interval (a bound that errs toward the host; readings must come more often than the window).
        """
        readings = self._readings
        if readings and reading.last_seq < readings[-1].last_seq:
            readings.clear()  # the stream was made anew: start over
        readings.append(reading)
        start = reading.at - self.share.window_s
        while len(readings) > 1 and readings[0].at < start:
            readings.popleft()
        total = written(readings[0], reading)
        if total is None:
            return None
        if total.records > self.share.max_records or total.bytes > self.share.max_bytes:
            return total
        return None

    def clear(self) -> None:
        """Forget every reading (the stream was closed: what it wrote before is paid for)."""
        self._readings.clear()
