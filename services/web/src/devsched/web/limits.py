"""What one client, and everybody together, may take of the dashboard: login failures and live streams.

- Logins: a client address that failed `per_ip` times within a minute, or everybody once `total` failures
  happened within a minute, is answered 429 with `Retry-After` on every login (the right token included)
  until the oldest of those failures is a minute old. Guessing the token costs a minute per few tries.
- Live streams: each holds a connection and, for a task or device page, reads of the scheduler; a client
  address may hold `per_client` at once and the process `total`, more are refused (429).

The client address is the connection's peer, or the `X-Forwarded-For` client that a trusted proxy names
(`DEVSCHED_WEB_FORWARDED_ALLOW_IPS`). Everything here is in memory, per process.
"""

from __future__ import annotations

import math
from collections import deque

#: Seconds over which login failures are counted.
WINDOW_S = 60.0


class LoginLimiter:
    """Failed logins per client address and in total, over the last `WINDOW_S` seconds."""

    def __init__(self, per_ip: int, total: int) -> None:
        self.per_ip = per_ip
        self.total = total
        self._by_ip: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def retry_after(self, ip: str, now: float) -> int | None:
        """Seconds (at least 1) before `ip` may try to log in again, or None: it may now."""
        _drop_old(self._all, now)
        waits = []
        if len(self._all) >= self.total:
            waits.append(self._all[0] + WINDOW_S - now)
        mine = self._by_ip.get(ip)
        if mine is not None:
            _drop_old(mine, now)
            if len(mine) >= self.per_ip:
                waits.append(mine[0] + WINDOW_S - now)
        return max(1, math.ceil(max(waits))) if waits else None

    def failed(self, ip: str, now: float) -> None:
        """Count a failed login of `ip`."""
        self._all.append(now)
        while len(self._all) > self.total:
            self._all.popleft()
        if len(self._by_ip) > 2 * self.total:  # addresses whose failures are all older than the window
            for stale in [a for a, times in self._by_ip.items() if not times or times[-1] <= now - WINDOW_S]:
                del self._by_ip[stale]
        mine = self._by_ip.setdefault(ip, deque())
        mine.append(now)
        while len(mine) > self.per_ip:
            mine.popleft()


def _drop_old(times: deque[float], now: float) -> None:
    while times and times[0] <= now - WINDOW_S:
        times.popleft()


class StreamSlots:
    """Open live streams per client address and in total."""

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self._open: dict[str, int] = {}
        self.open = 0

    def take(self, client: str) -> bool:
        """Take a slot for `client`, or False when it or the process has none left."""
        if self.open >= self.total or self._open.get(client, 0) >= self.per_client:
            return False
        self._open[client] = self._open.get(client, 0) + 1
        self.open += 1
        return True

    def give(self, client: str) -> None:
        """Give back a slot taken by `client`."""
        left = self._open.get(client, 0) - 1
        if left > 0:
            self._open[client] = left
        else:
            self._open.pop(client, None)
        self.open -= 1
