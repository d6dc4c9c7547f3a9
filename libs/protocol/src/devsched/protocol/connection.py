"""The one way every devsched process opens its NATS connection, and where a host's replies come back.

The services, the agent, the client and the dashboard differ only in how long they wait for the first
connection and what they log; the options (credentials, TLS, inbox, reconnect policy, name) are built
here, once, from `NatsSettings`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from devsched.protocol.tls import NatsSettings

#: Seconds between two tries of a server, first connection included (nats-py adds its own jitter).
RECONNECT_WAIT_S = 0.5
#: Seconds one try of one server may take.
CONNECT_TIMEOUT_S = 2.0
#: Where replies come back to a process that is not a host.
INBOX_PREFIX = "_INBOX"

ErrorCallback = Callable[[Exception], Awaitable[None]]
EventCallback = Callable[[], Awaitable[None]]


def host_inbox_prefix(host_id: str) -> str:
    """`_INBOX.<host_id>`: a host's replies and fetched assignments, so permissions can pin it there."""
    return f"{INBOX_PREFIX}.{host_id}"


async def connect(
    nc: Client,
    settings: NatsSettings,
    *,
    name: str,
    drain_timeout_s: float,
    host_id: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    error_cb: ErrorCallback | None = None,
    disconnected_cb: EventCallback | None = None,
    reconnected_cb: EventCallback | None = None,
) -> None:
    """Connect `nc` to `settings.nats_url` and keep it connected: nats-py retries forever, first try included.

    `nc` is the caller's, so that it can close it while this still waits. `host_id`: the connection is that
    host's, its replies under `host_inbox_prefix(host_id)`. Bound the wait with a timeout or a cancel.

    Raises:
        TlsConfigError: a credentials or TLS file is unusable (before anything is sent).
    """
    options = settings.tls_options(settings.nats_url)
    # nats-py annotates these durations as int but uses them as floats (asyncio timeouts).
    await nc.connect(
        servers=settings.servers,
        name=name,
        inbox_prefix=INBOX_PREFIX if host_id is None else host_inbox_prefix(host_id),
        max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]
        connect_timeout=connect_timeout_s,  # type: ignore[arg-type]
        drain_timeout=drain_timeout_s,  # type: ignore[arg-type]
        error_cb=error_cb,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        **options,
    )
