"""An HTTP probe of the services' health endpoints, as the kubelet sends it: one GET per connection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx


async def http(port: int, raw: bytes, *, timeout: float = 5.0) -> tuple[int, httpx.Headers, bytes]:  # noqa: ASYNC109
    """Send `raw` to 127.0.0.1:`port` as is; the status, headers (any case) and body of the answer (read to the
    close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(timeout):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = httpx.Headers([tuple(line.split(": ", 1)) for line in lines[1:]])
    return int(lines[0].split(" ")[1]), headers, body


async def probe(port: int, path: str) -> tuple[int, Any]:
    """GET `path`: the status and the JSON body (checked against the headers every answer carries)."""
    status, headers, body = await http(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert headers["Connection"] == "close"
    assert int(headers["Content-Length"]) == len(body)
    return status, json.loads(body)


async def probe_or_none(port: int, path: str) -> tuple[int, Any] | None:
    """`probe`, or None while nothing listens on `port` yet (a process still starting)."""
    try:
        return await probe(port, path)
    except OSError:
        return None
