"""The queue: queued tasks (next first, a page of them), running ones with their step, the newest ones.

With filters in the query string (`?status=failed&kind=user&device=d1&id=3af5939c`) it lists the matching
tasks of every status instead, newest first, a page at a time from `P.api.tasks.list` (`after`, its cursor,
in the next page's link); the page's live stream re-reads that page once per snapshot, shared by every
viewer of the same filters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from devsched.client import InvalidRequest
from devsched.web import live, views
from devsched.web.dashboard import Web, web_of
from devsched.web.sampler import Snapshot

#: Queued tasks a queue page lists (`?page=N` for the next ones): a page's cost does not grow with the queue.
QUEUE_ROWS = 200
#: Running tasks the queue page lists (the count says how many more).
RUNNING_ROWS = 200
#: Tasks a filtered page lists (the listing's cursor links the next ones).
FILTERED_ROWS = 100


def _fragment(web: Web, snap: Snapshot, page: int) -> str:
    """The queue's tables for one page of the queued tasks, rendered once per snapshot version and page.

    Ages are as of the snapshot (`snap.at`, at most a refresh old), so that one rendering serves everyone.
    """

    def render() -> str:
        now = snap.at
        progress = {task_id: r.progress for task_id, r in snap.progress.items()}
        queued = views.window(len(snap.queued), page, QUEUE_ROWS)
        return web.fragment(
            "_queue.html",
            queued=[views.task_row(t, now) for t in snap.queued[queued.start : queued.stop]],
            queued_window=queued,
            queued_capped=snap.queued_capped,
            running=[views.task_row(t, now, progress.get(str(t.task_id))) for t in snap.running[:RUNNING_ROWS]],
            running_total=len(snap.running),
            recent=[views.task_row(t, now) for t in snap.recent],
        )

    return web.cached(("queue", views.window(len(snap.queued), page, QUEUE_ROWS).page), snap.version, render)


@dataclass(frozen=True, slots=True)
class _Listed:
    """One page of the filtered listing: its rows and the cursor of the next page (None on the last)."""

    rows: list[views.TaskRow]
    next: str | None


async def _list(web: Web, snap: Snapshot, filters: views.QueueFilters) -> _Listed:
    try:
        page = await web.client.list_page(
            status=filters.status,
            kind=filters.kind,
            device_id=filters.device,
            id_prefix=filters.id_prefix,
            after=filters.after,
            limit=FILTERED_ROWS,
        )
    except InvalidRequest as exc:  # a cursor this listing did not make, say
        raise HTTPException(400, f"cannot list these tasks: {exc}") from None
    return _Listed([views.task_row(t, snap.at) for t in page.tasks], page.next)


def _filtered(web: Web, filters: views.QueueFilters, listed: _Listed) -> str:
    more = filters.query(after=listed.next) if listed.next else None
    first = filters.query() if filters.after else None
    return web.fragment("_queue_filtered.html", rows=listed.rows, more=more, first=first)


def _form(web: Web, filters: views.QueueFilters) -> dict[str, Any]:
    """What the filter form shows: the choices, the devices the lab knows, the values in force."""
    devices = sorted(d.device_id for h in web.sampler.snapshot.hosts for d in h.devices)
    return {
        "filters": filters,
        "statuses": views.FILTER_STATUSES,
        "kinds": views.FILTER_KINDS,
        "devices": devices,
    }


async def queue_page(request: Request) -> Response:
    """The queue (`?page=N`), or the tasks its filters match (`?status=&kind=&device=&id=`, `after`)."""
    web = web_of(request)
    filters, problems = views.queue_filters(request.query_params)
    if problems:  # nothing listed: a filter that cannot be applied never widens the list
        values = _form(web, views.QueueFilters())
        return web.page(request, "queue.html", status_code=400, problems=problems, fragment="", live=None, **values)
    if filters.active:
        snap = web.sampler.snapshot
        fragment = Markup(_filtered(web, filters, await _list(web, snap, filters)))
        live_url = "/queue/live" + filters.query(after=filters.after)
        return web.page(request, "queue.html", live=live_url, fragment=fragment, problems=[], **_form(web, filters))
    page = views.page_number(request.query_params.get("page"))
    url = "/queue/live" + (f"?page={page}" if page > 1 else "")
    fragment = Markup(_fragment(web, web.sampler.snapshot, page))
    return web.page(request, "queue.html", live=url, fragment=fragment, problems=[], **_form(web, filters))


async def queue_live(request: Request) -> Response:
    """The queue's tables as they change (the page given by `?page=N`, or the filtered page)."""
    web = web_of(request)
    filters, problems = views.queue_filters(request.query_params)
    if problems:
        raise HTTPException(400, "; ".join(problems))
    if filters.active:

        async def render(snap: Snapshot) -> str:
            # one read per snapshot for every stream of these filters and this page
            listed = await web.shared(("queue", filters), snap.version, lambda: _list(web, snap, filters))
            return _filtered(web, filters, listed)

        return live.stream(web, request, render)
    page = views.page_number(request.query_params.get("page"))
    return live.stream(web, request, lambda snap: _fragment(web, snap, page))
