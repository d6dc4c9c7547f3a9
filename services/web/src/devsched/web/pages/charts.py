"""The charts: tasks finished per minute by outcome, and the queue depth."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from devsched.web import charts, live
from devsched.web.dashboard import Web, web_of
from devsched.web.sampler import Snapshot

#: Minutes the charts show.
CHART_MINUTES = 60


def _values(web: Web, snap: Snapshot) -> dict[str, Any]:
    now = datetime.now(UTC)
    finished = web.sampler.series.finished_per_minute(now, CHART_MINUTES)
    depth = web.sampler.series.depth_per_minute(now, CHART_MINUTES)
    finished_bars, finished_top = charts.stacked_bars(finished, charts.PLOT_WIDTH, charts.PLOT_HEIGHT)
    depth_bars, depth_top = charts.depth_bars(depth, charts.PLOT_WIDTH, charts.PLOT_HEIGHT)
    totals = {o: sum(c.get(o, 0) for _, c in finished) for o in charts.OUTCOMES}
    return {
        "plot": {
            "width": charts.PLOT_WIDTH,
            "height": charts.PLOT_HEIGHT,
            "left": charts.MARGIN_LEFT,
            "top": charts.MARGIN_TOP,
            "box_width": charts.MARGIN_LEFT + charts.PLOT_WIDTH + 10,
            "box_height": charts.MARGIN_TOP + charts.PLOT_HEIGHT + charts.MARGIN_BOTTOM,
        },
        "x_ticks": charts.x_ticks([m for m, _ in finished]),
        "finished_ticks": charts.y_ticks(finished_top),
        "depth_ticks": charts.y_ticks(depth_top),
        "finished_bars": finished_bars,
        "finished_top": finished_top,
        "depth_bars": depth_bars,
        "depth_top": depth_top,
        "totals": totals,
        "minutes": CHART_MINUTES,
        "snapshot": snap,
        "now": now,
    }


async def charts_page(request: Request) -> Response:
    """Tasks finished per minute by outcome, and the queue depth."""
    web = web_of(request)
    return web.page(request, "charts.html", live="/charts/live", **_values(web, web.sampler.snapshot))


async def charts_live(request: Request) -> Response:
    """The charts as they change."""
    web = web_of(request)
    return live.stream(web, request, lambda snap: web.fragment("_charts.html", **_values(web, snap)))
