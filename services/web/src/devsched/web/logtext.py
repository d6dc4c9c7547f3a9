"""`/tasks/<id>/log.txt`: a task's step output as plain text, streamed as it is read.

The bytes are those `devsched logs --raw` prints for the same task, attempt and step: the output records
of the logs stream, read through the client's reader (`devsched.client.logs.output_bytes`), passed on as
they come. As on the task page, a lease id a step printed is masked (`views.LeaseMask`). The response is
`text/plain` with `nosniff` and shown inline, so a browser never renders the output as a page: NUL bytes,
escapes and markup arrive as the bytes they are. Like a live stream it holds one of the client's stream
slots while it is sent.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import nats.errors
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from devsched.client import DevschedError, NotFound
from devsched.client.logs import output_bytes
from devsched.web import live, views
from devsched.web.dashboard import task_id_of, web_of

log = logging.getLogger("devsched.web")

#: Longest step name taken from the query string (a plan's step names are shorter).
MAX_STEP_CHARS = 200


def _attempt(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 6 or int(raw) < 1:
        raise HTTPException(400, f"attempt: {raw[:20]!r} is not an attempt number (1, 2, ...)")
    return int(raw)


def _step(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_STEP_CHARS:
        raise HTTPException(400, f"step: longer than {MAX_STEP_CHARS} characters")
    return raw


async def task_log_text(request: Request) -> Response:
    """The latest attempt's step output (`?attempt=N`: that attempt's; `?step=NAME`: that step's) as text."""
    web = web_of(request)
    task_id = task_id_of(request)
    attempt = _attempt(request.query_params.get("attempt"))
    step = _step(request.query_params.get("step"))
    release = live.admit(web, request)
    try:
        view = await web.client.get(task_id)
        if attempt is not None and all(a.attempt != attempt for a in view.attempts):
            raise HTTPException(404, f"task {task_id} has no attempt {attempt}")
        mask = views.LeaseMask(str(a.lease_id) for a in view.attempts)
        chunks = output_bytes(web.client.logs(task_id, attempt=attempt, step=step))
        first = await anext(chunks, None)  # opens the reader: what cannot be read is a status, not a cut body
    except NotFound as exc:
        release()
        raise HTTPException(404, str(exc)) from None
    except (DevschedError, nats.errors.Error) as exc:
        release()
        log.warning("log text unavailable: %s", exc, extra={"task_id": str(task_id)})
        raise HTTPException(502, "the log cannot be read now") from None
    except BaseException:
        release()
        raise

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            if first is not None:
                yield mask.feed(first)
                async for chunk in chunks:
                    yield mask.feed(chunk)
            yield mask.flush()
        except (DevschedError, nats.errors.Error) as exc:
            # the status is sent: end the response before its last chunk, so it is not taken as whole
            log.warning("log text cut short: %s", exc, extra={"task_id": str(task_id)})
            raise
        finally:
            await chunks.aclose()

    name = f"{task_id}" + (f"-attempt-{attempt}" if attempt else "") + ".log.txt"
    headers = {
        "content-disposition": f'inline; filename="{name}"',
        "x-content-type-options": "nosniff",
        "x-accel-buffering": "no",
    }
    return live.HeldResponse(body(), release, media_type="text/plain; charset=utf-8", headers=headers)
