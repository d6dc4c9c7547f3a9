"""A closed-loop load: N requesters, each sending its next request when the last one was answered.

Every request's start time and latency is kept, so that one load can be read over several windows (the
renewals while idle, then while the sweeper works) and its rate is the requests started in a window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from devsched.bench.probes import CpuMeter, Distribution

#: The bench process's own CPU in a window's `cpu_s` (it sends the load; the figures leave it out).
LOAD_GENERATOR = "bench (load generator)"

#: One request of requester `i`.
Request = Callable[[int], Awaitable[object]]


class Load:
    """`start()` the requesters, read `samples(t0, t1)`, `stop()` them (a failed request stops the load)."""

    def __init__(self, request: Request, requesters: int) -> None:
        self._request = request
        self._requesters = requesters
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._starts: list[float] = []
        self._latencies: list[float] = []

    def start(self) -> None:
        """Start every requester."""
        self._tasks = [asyncio.create_task(self._run(i)) for i in range(self._requesters)]

    async def _run(self, i: int) -> None:
        while not self._stopping:
            started = time.perf_counter()
            await self._request(i)
            self._starts.append(started)
            self._latencies.append((time.perf_counter() - started) * 1000)

    async def stop(self) -> None:
        """Let each requester finish its request in flight, then end.

        Raises:
            Exception: the first request that failed.
        """
        self._stopping = True
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    @property
    def count(self) -> int:
        """Requests answered so far."""
        return len(self._latencies)

    def failed(self) -> BaseException | None:
        """The error of a requester that stopped on a failed request, if any."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    def samples(self, t0: float, t1: float) -> list[float]:
        """Latencies (ms) of the requests started in [t0, t1) (`time.perf_counter()` times)."""
        return [lat for start, lat in zip(self._starts, self._latencies, strict=False) if t0 <= start < t1]


@dataclass
class Window:
    """What a closed-loop load did in its measured window."""

    name: str
    requesters: int
    seconds: float
    latencies_ms: list[float]
    cpu_s: dict[str, float] = field(default_factory=dict)
    total: int = 0
    """Requests of the whole load, warm-up included (what a count over the load's whole span divides by)."""

    @property
    def count(self) -> int:
        """Requests started in the window."""
        return len(self.latencies_ms)

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def latency(self) -> Distribution:
        """Their latency distribution."""
        return Distribution.of(self.latencies_ms)

    def cpu_ms_per_request(self, *trees: str) -> float:
        """CPU milliseconds of `trees` per request."""
        return 1000 * sum(self.cpu_s.get(t, 0.0) for t in trees) / max(self.count, 1)

    def as_dict(self) -> dict[str, object]:
        """For the JSON output."""
        return {
            "requesters": self.requesters,
            "seconds": round(self.seconds, 3),
            "count": self.count,
            "rate_per_s": round(self.rate, 1),
            "latency": self.latency.as_dict(),
            "cpu_s": {k: round(v, 4) for k, v in self.cpu_s.items()},
        }


async def closed_loop(
    name: str,
    request: Request,
    requesters: int,
    *,
    warmup_s: float,
    window_s: float,
    meter: CpuMeter | None = None,
    on_window: Callable[[bool], object] | None = None,
) -> Window:
    """Run `requesters` loops of `request` for `warmup_s`, then measure `window_s` (CPU too, with `meter`).

    `on_window(True)` is called as the window opens and `on_window(False)` as it closes (a profiler).

    Raises:
        Exception: a request failed.
    """
    load = Load(request, requesters)
    load.start()
    try:
        await _sleep_watching(load, warmup_s)
        t0, own0 = time.perf_counter(), time.process_time()
        if meter is not None:
            meter.start()
        if on_window is not None:
            on_window(True)
        await _sleep_watching(load, window_s)
        t1 = time.perf_counter()
        cpu = dict(meter.stop()) if meter is not None else {}
        cpu[LOAD_GENERATOR] = time.process_time() - own0
        if on_window is not None:
            on_window(False)
    finally:
        await load.stop()
    return Window(name, requesters, t1 - t0, load.samples(t0, t1), cpu, load.count)


async def _sleep_watching(load: Load, seconds: float) -> None:
    """Sleep, but fail as soon as a requester fails."""
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        await asyncio.sleep(min(left, 0.2))
        if (error := load.failed()) is not None:
            raise error
