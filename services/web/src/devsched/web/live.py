"""Live streams (server-sent events): the pages' live regions, kept current by `static/app.js`.

A stream re-renders its region at each new snapshot of the sampler and sends it when it changed
(`fragment`); `end` tells the page to stop listening. Each stream holds one of the client's and the
process's stream slots until it ends, however it ends, and lasts at most `web_stream_max_s` (the browser
then opens a new one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import StreamingResponse

from devsched.client import DevschedError
from devsched.web.dashboard import Web, client_address
from devsched.web.sampler import Snapshot

log = logging.getLogger("devsched.web")

#: Seconds between keep-alive comments on a quiet event stream.
KEEPALIVE_S = 15.0


def sse(event: str, data: str) -> str:
    """One server-sent event."""
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def admit(web: Web, request: Request) -> Callable[[], None]:
    """A slot for one more live stream of this client, or 429; the function that gives it back (once)."""
    client = client_address(request)
    if not web.streams.take(client):
        raise HTTPException(429, "too many live streams open: close some pages", headers={"retry-after": "10"})
    given = False

    def release() -> None:
        nonlocal given
        if not given:
            given = True
            web.streams.give(client)

    return release


class HeldResponse(StreamingResponse):
    """A streamed response holding a stream slot (`admit`) until it ends, however it ends."""

    def __init__(
        self,
        content: AsyncGenerator[str, None] | AsyncGenerator[bytes, None],
        release: Callable[[], None],
        *,
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Stream the body, then give the slot back."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class LiveResponse(HeldResponse):
    """An event stream holding a stream slot until it ends, however it ends."""

    def __init__(self, content: AsyncGenerator[str, None], release: Callable[[], None]) -> None:
        super().__init__(content, release, media_type="text/event-stream", headers={"x-accel-buffering": "no"})


async def bounded(events: AsyncGenerator[str, None], lifetime_s: float, last: str = "") -> AsyncGenerator[str, None]:
    """`events` for at most `lifetime_s` seconds, then `last` and the end (a browser opens a new stream)."""
    deadline = time.monotonic() + lifetime_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                yield await asyncio.wait_for(anext(events), left)
            except StopAsyncIteration:
                return
            except TimeoutError:
                break
        if last:
            yield last
    finally:
        await events.aclose()


def stream(
    web: Web,
    request: Request,
    render: Callable[[Snapshot], str | Awaitable[str]],
    *,
    ended: Callable[[], Awaitable[bool]] | None = None,
) -> StreamingResponse:
    """An event stream of `fragment` events: the region re-rendered at each new snapshot when it changed.

    With `ended`, the stream sends `end` (the page stops listening) once it says the subject is over.
    Admitted only within the client's and the process's stream slots (else 429), for `web_stream_max_s`.
    """
    release = admit(web, request)

    async def events() -> AsyncGenerator[str, None]:
        yield "retry: 2000\n\n"
        version = -1
        last = None
        while True:
            snap = await web.sampler.changed(version, KEEPALIVE_S)
            if snap.version == version:
                yield ": keep-alive\n\n"
                continue
            version = snap.version
            try:
                html = render(snap)
                if not isinstance(html, str):
                    html = await html
            except HTTPException as exc:
                yield sse("gone", json.dumps(str(exc.detail)))
                return
            except DevschedError as exc:
                log.warning("live render failed: %s", exc)
                continue
            if html != last:
                last = html
                yield sse("fragment", html)
            if ended is not None and await ended():
                yield sse("end", "{}")
                return

    return LiveResponse(bounded(events(), web.settings.web_stream_max_s), release)
