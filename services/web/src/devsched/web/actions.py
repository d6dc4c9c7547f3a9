"""The actions: cancel or resubmit a task, drain or undrain a device (POST forms).

Off unless `web_actions`; then each is guarded by the `Origin` check, the CSRF token (`Web.guard`) and
the operator's session (`Web.logged_in`), and answers with a redirect to the page it was made from.
"""

from __future__ import annotations

import logging
import time

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from devsched.client import DevschedError, InvalidRequest, NotFound
from devsched.web import security
from devsched.web.dashboard import Web, task_id_of, web_of

log = logging.getLogger("devsched.web")


def _refuse_unless_logged_in(web: Web, request: Request) -> None:
    if not web.logged_in(request):
        if web.sessions is not None and web.sessions.ending(request.cookies.get(security.SESSION_COOKIE), time.time()):
            web.refuse_unless_sessions_checked()  # a signed session this replica cannot check now: 503, not 403
        raise HTTPException(403, "log in with the operator token first")


async def cancel(request: Request) -> Response:
    """Cancel a task (action)."""
    web = web_of(request)
    await web.guard(request)
    _refuse_unless_logged_in(web, request)
    task_id = task_id_of(request)
    try:
        await web.client.cancel(task_id, reason="cancelled from devsched-web")
    except NotFound:
        raise HTTPException(404, f"no task {task_id}") from None
    log.info("task cancelled from the dashboard", extra={"task_id": str(task_id)})
    web.sampler.poke()
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)


async def resubmit(request: Request) -> Response:
    """Submit a new task with this task's plan, selector and options (action); to the new task's page.

    Through `P.api.tasks.submit`, as `devsched resubmit` does (`devsched.client.resubmit`): this dashboard
    resubmits only when its NATS user may submit.
    """
    web = web_of(request)
    await web.guard(request)
    _refuse_unless_logged_in(web, request)
    task_id = task_id_of(request)
    try:
        reply = await web.client.resubmit(task_id)
    except NotFound:
        raise HTTPException(404, f"no task {task_id}") from None
    except InvalidRequest as exc:
        raise HTTPException(400, str(exc)) from None
    except DevschedError as exc:  # no reply (this dashboard's NATS user may not submit, say): nothing submitted
        raise HTTPException(502, f"not resubmitted: {exc}") from None
    log.info("task resubmitted from the dashboard", extra={"task_id": str(task_id), "new_task_id": str(reply.task_id)})
    web.sampler.poke()
    return RedirectResponse(f"/tasks/{reply.task_id}", status_code=303)


async def drain(request: Request) -> Response:
    """Drain (`drained=true`) or undrain (`drained=false`) a device (action)."""
    web = web_of(request)
    form = await web.guard(request)
    _refuse_unless_logged_in(web, request)
    device_id = request.path_params["device_id"]
    drained = form.get("drained") != "false"
    reason = form.get("reason")
    try:
        await web.client.drain(
            device_id, drained=drained, reason=(reason if isinstance(reason, str) and reason else None)
        )
    except NotFound:
        raise HTTPException(404, f"no device {device_id}") from None
    except DevschedError as exc:
        raise HTTPException(400, str(exc)) from None
    log.info("device %s from the dashboard", "drained" if drained else "undrained", extra={"device_id": device_id})
    await web.sampler.sample()
    return RedirectResponse(f"/devices/{device_id}", status_code=303)
