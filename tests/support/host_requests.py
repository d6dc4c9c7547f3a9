"""Every request a host sends to the scheduler, heard on `P.host.<host_id>.*` beside the scheduler.

One token after the host id: the request verbs, not the host's step output (`P.host.<id>.log.>`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg


class HostRequests:
    """The requests heard, in order: (monotonic time, verb, body) as sent (`sent`), and as leases (`heard`:
    a `renewals` request is one `renew` of each lease it names, a `reports` request one `report` of each
    report it carries)."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, dict[str, object]]] = []
        self.heard: list[tuple[str, dict[str, object]]] = []

    async def hear(self, msg: Msg) -> None:
        verb = msg.subject.rsplit(".", 1)[1]
        body = json.loads(msg.data) if msg.data else {}
        self.sent.append((time.monotonic(), verb, body))
        if verb == "renewals":
            self.heard.extend(("renew", lease) for lease in body["leases"])
        elif verb == "reports":
            self.heard.extend(("report", report) for report in body["reports"])
        else:
            self.heard.append((verb, body))

    def of(self, task_id: str) -> Counter[str]:
        """How many requests of each verb named `task_id` (each lease of a `renewals` as a `renew`, each
        report of a `reports` as a `report`)."""
        return Counter(verb for verb, body in self.heard if body.get("task_id") == task_id)

    def since(self, start: float, verb: str) -> list[dict[str, object]]:
        """The bodies of the requests of `verb` sent at or after monotonic `start`, as sent."""
        return [body for at, sent_verb, body in self.sent if at >= start and sent_verb == verb]


@contextlib.asynccontextmanager
async def listening(nc: NatsClient, prefix: str, host_id: str) -> AsyncIterator[HostRequests]:
    """Hear `host_id`'s requests while the block runs."""
    heard = HostRequests()
    sub = await nc.subscribe(f"{prefix}.host.{host_id}.*", cb=heard.hear)
    await nc.flush()
    try:
        yield heard
    finally:
        await sub.unsubscribe()
