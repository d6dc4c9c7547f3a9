"""The NATS connection of a service: reconnect forever, log state changes once, drain quickly."""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from devsched.protocol.connection import connect
from devsched.protocol.tls import NatsSettings

log = logging.getLogger("devsched.service.nats")


class Stopped(Exception):
    """The service was asked to stop before the connection came up."""


def _server(nc: Client) -> str:
    """`host:port` of the connected server: never the URL's user and password."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None else ""


async def connect_nats(
    settings: NatsSettings, *, name: str, stop: asyncio.Event, drain_timeout_s: float, host_id: str | None = None
) -> Client:
    """Connect to `settings.nats_url` (`devsched.protocol.connection.connect`) until it answers or `stop` is set.

    A service may start before NATS does: the first connection is retried like later ones, and each
    distinct error is logged once (a server whose certificate does not verify says
    `nats error: ...CERTIFICATE_VERIFY_FAILED`). `host_id`: a host's connection, replies under its inbox.

    Raises:
        Stopped: `stop` was set first.
        TlsConfigError: a credentials or TLS file is unusable.
    """
    last_error: list[str] = []

    async def on_error(exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if not last_error or last_error[-1] != text:  # once per distinct error, not once per retry
            log.warning("nats error: %s", text)
            last_error[:] = [text]

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # our own drain at shutdown is not news
            log.warning("nats disconnected")

    async def on_reconnected() -> None:
        last_error.clear()
        log.info("nats reconnected", extra={"server": _server(nc)})

    nc = Client()
    connecting = asyncio.ensure_future(
        connect(
            nc,
            settings,
            name=name,
            drain_timeout_s=drain_timeout_s,
            host_id=host_id,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
        )
    )
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        await nc.close()
        raise Stopped()
    connecting.result()
    log.info("nats connected", extra={"server": _server(nc)})
    return nc


async def close_nats(nc: Client) -> None:
    """Drain the connection (bounded by its drain_timeout), or close it if draining is not possible."""
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except Exception as exc:  # a drain that times out or meets a closed socket: close is what is left
        log.warning("nats drain failed (%s); closing", type(exc).__name__)
        await nc.close()


async def flush_subscriptions(nc: Client, timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Return once the server has every subscription made so far.

    nats-py 2.16's `flush()` writes its PING straight to the socket while SUB commands may still sit in
    the client's pending buffer, so its PONG can come back before the server has seen them (a request
    right after "ready" then meets no responders). The first flush pushes the buffer out behind its PING;
    the second one's PONG comes after the server processed it.
    """
    await nc.flush(timeout=timeout)  # type: ignore[arg-type]
    await nc.flush(timeout=timeout)  # type: ignore[arg-type]
