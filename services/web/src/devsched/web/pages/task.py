"""One task: status, attempts as a timeline, test results, events, the live log, the plan."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from devsched.client import DevschedError, NotFound
from devsched.client.resubmit import resubmit_of
from devsched.client.watch import stored_events
from devsched.core.status import TERMINAL
from devsched.protocol.messages import LogKind
from devsched.web import live, views
from devsched.web.dashboard import Web, task_id_of, web_of
from devsched.web.sampler import Snapshot


async def _values(web: Web, task_id: uuid.UUID) -> dict[str, Any]:
    try:
        view, events = await asyncio.gather(web.client.get(task_id), stored_events(web.client, task_id))
    except NotFound:
        raise HTTPException(404, f"no task {task_id}") from None
    if "artifacts" in view.truncated:  # cut to fit one reply: the listing pages them
        view = view.model_copy(update={"artifacts": (await web.client.artifacts(task_id)).artifacts})
    now = datetime.now(UTC)
    return {
        "task": view,
        "status": str(view.status),
        "attempts": [views.attempt_row(a, events, now) for a in reversed(view.attempts)],
        "events": events,
        "steps": views.step_rows(view),
        "results": views.result_summaries(view),
        "artifacts": views.artifacts(view),
        "policy": views.policy_rows(view),
        "metadata": views.redact(view.metadata),
        "cancellable": views.cancellable(str(view.status)),
        "resubmittable": views.resubmittable(view),
        "resubmit_of": resubmit_of(view.metadata),
        "now": now,
    }


async def task_page(request: Request) -> Response:
    """One task: status, attempts as a timeline, test results, events, the live log, the plan."""
    web = web_of(request)
    task_id = task_id_of(request)
    values = await _values(web, task_id)
    return web.page(request, "task.html", live=f"/tasks/{task_id}/live", **values)


async def task_live(request: Request) -> Response:
    """The task's live part as it changes, until the task ends."""
    web = web_of(request)
    task_id = task_id_of(request)
    base = web.live_context(request)
    held: list[dict[str, Any]] = []

    async def render(snap: Snapshot) -> str:
        # one read of the task per snapshot, whatever the number of its pages open
        values: dict[str, Any] = await web.shared(("task", task_id), snap.version, lambda: _values(web, task_id))
        held[:] = [values]
        return web.fragment("_task.html", **{**base, **values})

    async def over() -> bool:
        return bool(held) and held[0]["task"].status in TERMINAL

    return live.stream(web, request, render, ended=over)


async def task_log(request: Request) -> Response:
    """The task's step output as events: `output` (JSON text), `step` (a step ended), `end`."""
    web = web_of(request)
    task_id = task_id_of(request)
    release = live.admit(web, request)
    try:
        view = await web.client.get(task_id)
    except NotFound:
        release()
        raise HTTPException(404, f"no task {task_id}") from None
    except BaseException:
        release()
        raise
    leases = {str(a.lease_id) for a in view.attempts}

    async def lines() -> AsyncGenerator[str, None]:
        yield "retry: 3000\n\n"
        try:
            async with web.client.logs(task_id, follow=True) as records:
                attempt = None
                async for record in records:
                    if record.attempt != attempt:
                        attempt = record.attempt
                        leases.update(str(a.lease_id) for a in (await web.client.get(task_id)).attempts)
                        yield live.sse("output", json.dumps(f"── attempt {attempt} ──\n"))
                    if record.kind == LogKind.OUTPUT:
                        text = record.content().decode("utf-8", "replace")
                        yield live.sse("output", json.dumps(views.hide_lease_ids(text, leases)))
                    elif record.kind == LogKind.STEP_END:
                        yield live.sse("output", json.dumps(f"── step {record.step} {record.status} ──\n"))
                    elif record.kind in (LogKind.DROPPED, LogKind.TRUNCATED, LogKind.REFUSED):
                        yield live.sse("output", json.dumps(f"── {record.kind} ──\n"))
        except DevschedError as exc:
            yield live.sse("output", json.dumps(f"── log unavailable: {exc} ──\n"))
        yield live.sse("end", "{}")

    expired = live.sse("output", json.dumps("── live log closed after a while: reload the page to follow ──\n"))
    last = expired + live.sse("end", "{}")
    return live.LiveResponse(live.bounded(lines(), web.settings.web_stream_max_s, last), release)
