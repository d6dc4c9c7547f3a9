"""The queue: queued tasks (next first, a page of them), running ones with their step, the newest ones."""

from __future__ import annotations

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from devsched.web import live, views
from devsched.web.dashboard import Web, web_of
from devsched.web.sampler import Snapshot

#: Queued tasks a queue page lists (`?page=N` for the next ones): a page's cost does not grow with the queue.
QUEUE_ROWS = 200
#: Running tasks the queue page lists (the count says how many more).
RUNNING_ROWS = 200


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


async def queue_page(request: Request) -> Response:
    """Queued tasks (next first, a page of them: `?page=N`), running ones with their step, the newest ones."""
    web = web_of(request)
    page = views.page_number(request.query_params.get("page"))
    url = "/queue/live" + (f"?page={page}" if page > 1 else "")
    fragment = Markup(_fragment(web, web.sampler.snapshot, page))
    return web.page(request, "queue.html", live=url, fragment=fragment)


async def queue_live(request: Request) -> Response:
    """The queue's tables as they change (the page given by `?page=N`)."""
    web = web_of(request)
    page = views.page_number(request.query_params.get("page"))
    return live.stream(web, request, lambda snap: _fragment(web, snap, page))
