"""One device: state, what runs on it, its history of tasks and health checks, drain and undrain."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from devsched.client import InvalidRequest
from devsched.web import live, views
from devsched.web.dashboard import Web, web_of
from devsched.web.sampler import Snapshot


@dataclass(slots=True)
class _History:
    """A device's history page as last read, and the device's change count when it was read."""

    rows: list[views.HistoryRow]
    more: str | None
    changes: int


async def _read_history(web: Web, device_id: str, after: str | None) -> _History:
    """One page of the device's tasks and health checks from `P.api.tasks.list`."""
    changes = web.sampler.device_changes.get(device_id, 0)
    page = await web.sampler.client.list_page(device_id=device_id, limit=views.HISTORY_PAGE, after=after)
    return _History(views.device_history(page.tasks), views.more_path(device_id, page.next), changes)


def _values(snap: Snapshot, device_id: str, history: _History) -> dict[str, Any]:
    for host in snap.hosts:
        for device in host.devices:
            if device.device_id == device_id:
                state = views.device_state(device, host.online)
                return {
                    "device": device,
                    "host": host,
                    "state": state,
                    "running": snap.on_device.get(device_id),
                    "history": history.rows,
                    "more": history.more,
                    "snapshot": snap,
                    "now": datetime.now(UTC),
                }
    raise HTTPException(404, f"no device {device_id}")


def _history_query(request: Request) -> str | None:
    after = request.query_params.get("after")
    return after or None


async def device_page(request: Request) -> Response:
    """One device: state, what runs on it, its history of tasks and health checks, drain and undrain."""
    web = web_of(request)
    device_id = request.path_params["device_id"]
    after = _history_query(request)
    try:
        history = await _read_history(web, device_id, after)
    except InvalidRequest as exc:
        raise HTTPException(400, str(exc)) from None
    values = _values(web.sampler.snapshot, device_id, history)
    url = f"/devices/{device_id}/live" + (f"?after={quote(after, safe='')}" if after else "")
    return web.page(request, "device.html", live=url, **values)


async def device_live(request: Request) -> Response:
    """The device's live part as it changes; its history is re-read when the device's tasks changed."""
    web = web_of(request)
    device_id = request.path_params["device_id"]
    after = _history_query(request)
    base = web.live_context(request)
    held: list[_History] = []

    async def render(snap: Snapshot) -> str:
        changes = web.sampler.device_changes.get(device_id, 0)
        if not held or held[0].changes != changes:
            # one read per change of the device, whatever the number of its pages open
            history = web.shared(("history", device_id, after), changes, lambda: _read_history(web, device_id, after))
            held[:] = [await history]
        return web.fragment("_device.html", **{**base, **_values(snap, device_id, held[0])})

    return live.stream(web, request, render)
