"""The lab: every host and device, coloured by state, filtered by `?label=key=value`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from devsched.web import live, views
from devsched.web.dashboard import web_of
from devsched.web.sampler import Snapshot


def _values(snap: Snapshot, filters: Mapping[str, str]) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"lab": views.lab(snap.hosts, snap.on_device, filters, now), "snapshot": snap, "now": now}


async def lab_page(request: Request) -> Response:
    """The lab: every host and device, coloured by state, filtered by `?label=key=value`."""
    web = web_of(request)
    filters = views.parse_label_filters(request.query_params.getlist("label"))
    values = _values(web.sampler.snapshot, filters)
    query = "?" + urlencode([("label", f"{k}={v}") for k, v in filters.items()]) if filters else ""
    return web.page(request, "lab.html", live="/lab/live" + query, **values)


async def lab_live(request: Request) -> Response:
    """The lab's grid as it changes."""
    web = web_of(request)
    filters = views.parse_label_filters(request.query_params.getlist("label"))
    return live.stream(web, request, lambda snap: web.fragment("_lab.html", **_values(snap, filters)))
