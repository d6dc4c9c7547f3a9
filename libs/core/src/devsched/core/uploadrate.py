"""A host's uploads rate share: the bytes its artifact commits purged from its uploads stream, over a window.

A commit purges its upload's chunks whatever its outcome (stored, mismatch, timeout, refused), so a host
looping commits could rewrite its whole uploads share once per commit, each chunk a write (and, with
`sync_interval: always`, an fsync) of the shared JetStream store. So each commit charges its host what it
purged; once a host's charges within the last `window_s` pass `bytes_per_s * window_s`, its next commits
are refused for `window_s` (commits already running finish and are charged). A refused commit purges
nothing: the host's stream stays as full as it is, and JetStream itself refuses its further chunks.

This is not the arithmetic of `outputrate`: that one reads a stream's state at a fixed interval, while a
commit knows exactly what it purged when it ends, so here each charge is kept with its time.

Pure: `at` is a monotonic reading the caller takes, never read here.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class UploadShare:
    """One host's share of the uploads' write rate.

    Raises:
        ValueError: a bound is not a finite number above 0.
    """

    #: Bytes a second, averaged over `window_s`.
    bytes_per_s: float
    #: The window the rate is averaged over, and how long a host past it has its commits refused, in seconds.
    window_s: float

    def __post_init__(self) -> None:
        for name in ("bytes_per_s", "window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number above 0")

    @property
    def max_bytes(self) -> float:
        """Bytes a host's commits may purge in one window."""
        return self.bytes_per_s * self.window_s


@dataclass(slots=True)
class _Charges:
    """One host's charges within the window, oldest first, and their sum."""

    items: deque[tuple[float, int]] = field(default_factory=deque)
    total: int = 0


class UploadCharges:
    """Every host's charges over the last window, and which hosts are refused until when."""

    __slots__ = ("_charges", "_refused", "share")

    def __init__(self, share: UploadShare) -> None:
        self.share = share
        self._charges: dict[str, _Charges] = {}
        self._refused: dict[str, float] = {}

    def refused_for(self, host_id: str, at: float) -> float | None:
        """Seconds until `host_id` may commit again, or None when it may now."""
        until = self._refused.get(host_id)
        if until is None:
            return None
        if at >= until:
            del self._refused[host_id]
            return None
        return until - at

    def charge(self, host_id: str, size: int, at: float) -> int | None:
        """Charge `host_id` for `size` bytes purged; the window's total when that takes it past its share, else None.

        Past its share, the host is refused for `window_s` from `at`, and its charges so far are paid for.
        """
        if size <= 0:
            return None
        charges = self._charges.get(host_id)
        if charges is None:
            charges = self._charges[host_id] = _Charges()
        charges.items.append((at, size))
        charges.total += size
        start = at - self.share.window_s
        while charges.items[0][0] <= start:
            charges.total -= charges.items.popleft()[1]
        if charges.total <= self.share.max_bytes:
            return None
        total = charges.total
        del self._charges[host_id]
        self._refused[host_id] = at + self.share.window_s
        return total
