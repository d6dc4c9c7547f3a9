"""Streaming one stored artifact to the browser, chunk by chunk, straight from the `<PU>_ARTIFACTS` bucket.

The web user may read that bucket (never write it: deploy/nats/accounts.conf). The bytes come through the
client's reader (`devsched.client.artifacts.open_chunks`), passed on as they arrive so that a large file
never sits in the dashboard's memory, and checked against the size and SHA-256 the scheduler recorded: a
mismatch ends the response before its last byte (the browser then reports a failed download rather
than saving wrong bytes as complete).
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import nats.errors
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from devsched.client import DevschedError, NotFound
from devsched.client.artifacts import open_chunks, pick
from devsched.web.dashboard import task_id_of, web_of

log = logging.getLogger("devsched.web")


async def artifact_download(request: Request) -> Response:
    """One stored artifact as an attachment, streamed from the artifacts bucket through this process."""
    web = web_of(request)
    task_id = task_id_of(request)
    attempt = int(request.path_params["attempt"])
    name = request.path_params["name"]
    try:
        listing = await web.client.artifacts(task_id, attempt=attempt)
        artifact = pick(listing.artifacts, name, attempt)
        chunks = await open_chunks(web.client, listing.bucket, artifact)
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except (DevschedError, nats.errors.Error) as exc:
        log.warning("artifact download failed: %s", exc, extra={"task_id": str(task_id)})
        raise HTTPException(502, "the artifact cannot be read now") from None
    filename = name.rsplit("/", 1)[-1]
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in filename)
    headers = {
        "content-disposition": f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}",
        "content-length": str(artifact.size),
        "x-devsched-sha256": artifact.sha256,
    }
    log.info("artifact downloaded", extra={"task_id": str(task_id), "attempt": attempt, "size": artifact.size})
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)
