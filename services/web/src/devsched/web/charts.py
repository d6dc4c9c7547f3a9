"""Rolling per-minute series for the charts page, kept in the web process's memory.

No stats endpoint exists: the dashboard counts the terminal task events it sees (tasks finished per minute
by outcome) and samples the queue depth at each refresh (the largest depth of each minute). Both start
empty when the process starts and keep `window_min` minutes; several replicas each keep their own.
`stacked_bars` and `depth_bars` turn a series into SVG rectangles, `x_ticks` and `y_ticks` label the axes
(time in UTC, and the count plotted); all server-rendered, no JavaScript.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

#: Outcomes counted, in stacking order.
OUTCOMES = ("done", "failed", "cancelled")
#: Minutes kept by default (the last three hours).
WINDOW_MIN = 180


def minute_of(at: datetime) -> int:
    """Minutes since the epoch of `at` (naive datetimes are read as UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() // 60)


class Series:
    """Per-minute counts of finished tasks by outcome, and the queue depth per minute."""

    def __init__(self, window_min: int = WINDOW_MIN) -> None:
        self.window_min = window_min
        self._finished: OrderedDict[int, dict[str, int]] = OrderedDict()
        self._depth: OrderedDict[int, int] = OrderedDict()

    def finished(self, outcome: str, at: datetime) -> None:
        """Count one task that ended with `outcome` at `at`."""
        minute = minute_of(at)
        bucket = self._finished.setdefault(minute, dict.fromkeys(OUTCOMES, 0))
        bucket[outcome] = bucket.get(outcome, 0) + 1
        self._trim(minute)

    def depth(self, queued: int, at: datetime) -> None:
        """Record a sample of the queue depth; a minute keeps its largest sample."""
        minute = minute_of(at)
        self._depth[minute] = max(queued, self._depth.get(minute, 0))
        self._trim(minute)

    def _trim(self, newest: int) -> None:
        oldest = newest - self.window_min + 1
        for series in (self._finished, self._depth):
            while series and next(iter(series)) < oldest:
                series.popitem(last=False)

    def finished_per_minute(self, now: datetime, minutes: int) -> list[tuple[int, dict[str, int]]]:
        """The last `minutes` minutes up to `now`, oldest first, every minute present (zeros included)."""
        last = minute_of(now)
        empty = dict.fromkeys(OUTCOMES, 0)
        return [(m, dict(self._finished.get(m, empty))) for m in range(last - minutes + 1, last + 1)]

    def depth_per_minute(self, now: datetime, minutes: int) -> list[tuple[int, int | None]]:
        """The last `minutes` minutes up to `now`, oldest first; None where no sample was taken."""
        last = minute_of(now)
        return [(m, self._depth.get(m)) for m in range(last - minutes + 1, last + 1)]


@dataclass(frozen=True, slots=True)
class Bar:
    """One SVG rectangle: position, size, CSS class and its accessible title."""

    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True, slots=True)
class Tick:
    """One labelled mark on an axis: its position along the axis in the plot box, and its text."""

    at: float
    label: str


#: The plot box of each chart inside its SVG: the bars' width and height, and the margins left for the axes.
PLOT_WIDTH, PLOT_HEIGHT = 600.0, 160.0
MARGIN_LEFT, MARGIN_TOP, MARGIN_BOTTOM = 56.0, 10.0, 44.0


def y_ticks(top: int, height: float = PLOT_HEIGHT, count: int = 4) -> list[Tick]:
    """Whole-number marks from 0 to `top` (at most `count + 1`), measured down from the top of the box."""
    values = sorted({round(top * i / count) for i in range(count + 1)})
    return [Tick(height - height * v / top, str(v)) for v in values]


def x_ticks(minutes: list[int], width: float = PLOT_WIDTH, every: int = 15) -> list[Tick]:
    """A mark at each quarter hour (`every` minutes, UTC) among `minutes`, at the middle of its bar."""
    step = width / max(1, len(minutes))
    return [Tick(i * step + step / 2, _label(m)) for i, m in enumerate(minutes) if m % every == 0]


def _label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%H:%M")


def stacked_bars(data: list[tuple[int, dict[str, int]]], width: float, height: float) -> tuple[list[Bar], int]:
    """Stacked bars of finished tasks per minute, scaled to the box; and the tallest stack."""
    top = max((sum(counts.values()) for _, counts in data), default=0) or 1
    step = width / max(1, len(data))
    bars: list[Bar] = []
    for i, (minute, counts) in enumerate(data):
        base = height
        for outcome in OUTCOMES:
            n = counts.get(outcome, 0)
            if not n:
                continue
            h = height * n / top
            base -= h
            bars.append(Bar(i * step, base, max(step - 1, 1), h, f"bar-{outcome}", f"{_label(minute)} {outcome}: {n}"))
    return bars, top


def depth_bars(data: list[tuple[int, int | None]], width: float, height: float) -> tuple[list[Bar], int]:
    """Bars of the queue depth per minute (minutes without a sample are left out); and the largest."""
    top = max((d for _, d in data if d is not None), default=0) or 1
    step = width / max(1, len(data))
    bars = [
        Bar(i * step, height - height * d / top, max(step - 1, 1), height * d / top, "bar-depth", f"{_label(m)}: {d}")
        for i, (m, d) in enumerate(data)
        if d is not None
    ]
    return bars, top
