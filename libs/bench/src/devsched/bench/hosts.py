"""A host that speaks the wire protocol itself, for the renewal and sweep loads.

Like the agent it has one NATS connection with its own inbox prefix (`host_inbox_prefix`), so that the
scheduler answers it as it answers an agent and all its requests share one reply subscription; unlike the
agent it renews as fast as it is told to, and holds leases without running anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from devsched.protocol.connection import host_inbox_prefix
from devsched.protocol.subjects import Subjects

#: The header of an error reply (NATS micro).
ERROR_CODE_HEADER = "Nats-Service-Error-Code"


class HostRequestError(Exception):
    """The scheduler answered a host request with an error."""


def checked(msg: Msg) -> dict[str, Any]:
    """The reply's JSON body; an error reply raises `HostRequestError`."""
    if msg.headers and ERROR_CODE_HEADER in msg.headers:
        raise HostRequestError(f"{msg.headers[ERROR_CODE_HEADER]}: {msg.data[:300]!r}")
    body = json.loads(msg.data) if msg.data else {}
    if not isinstance(body, dict):
        raise HostRequestError(f"unexpected reply {msg.data[:300]!r}")
    return body


def renewed(msg: Msg, leases: Sequence[Mapping[str, Any]]) -> int:
    """How many leases a `renewals` reply renewed: every one of `leases`, or it raises.

    Raises:
        HostRequestError: an error reply, an outcome with an `error`, or not one outcome per lease in order.
    """
    outcomes = checked(msg).get("leases")
    if not isinstance(outcomes, list) or len(outcomes) != len(leases):
        raise HostRequestError(f"not one outcome per lease: {msg.data[:300]!r}")
    for lease, outcome in zip(leases, outcomes, strict=True):
        if outcome.get("lease_id") != lease["lease_id"] or "error" in outcome or "expires_at" not in outcome:
            raise HostRequestError(f"lease {lease['lease_id']} not renewed: {outcome!r}")
    return len(outcomes)


def lease_of(assignment: Mapping[str, Any]) -> dict[str, Any]:
    """`{task_id, attempt, lease_id}` of an assignment: what claim, renew and report name."""
    return {k: assignment[k] for k in ("task_id", "attempt", "lease_id")}


class BenchHost:
    """One protocol-speaking host: `connect`, `register`, `bind`, `assignments`, `claim`, requests."""

    def __init__(self, nats_url: str, prefix: str, host_id: str) -> None:
        self.nats_url = nats_url
        self.subjects = Subjects(prefix)
        self.host_id = host_id
        self.nc: NatsClient | None = None
        self._psub: JetStreamContext.PullSubscription | None = None
        self._heartbeats: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Open the host's connection."""
        self.nc = await nats.connect(
            self.nats_url, inbox_prefix=host_inbox_prefix(self.host_id), name=f"bench-host-{self.host_id}"
        )

    def subject(self, verb: str) -> str:
        """`P.host.<host_id>.<verb>`."""
        return self.subjects.host(self.host_id, verb)

    async def request(self, verb: str, body: bytes | Mapping[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:  # noqa: ASYNC109
        """One request; error replies raise `HostRequestError`."""
        assert self.nc is not None
        data = body if isinstance(body, bytes) else json.dumps(dict(body)).encode()
        return checked(await self.nc.request(self.subject(verb), data, timeout=timeout))

    async def register(self, devices: Sequence[tuple[str, Mapping[str, str]]]) -> float:
        """Register exactly these devices; returns the heartbeat interval."""
        listed = [{"device_id": d, "labels": dict(labels)} for d, labels in devices]
        reply = await self.request("register", {"devices": listed, "agent_version": "devsched-bench"})
        return float(reply["heartbeat_interval_s"])

    def start_heartbeats(self, interval_s: float) -> None:
        """Heartbeat every `interval_s` until `close()` (a host that only renews stays online anyway)."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval_s)
                with contextlib.suppress(Exception):
                    await self.request("heartbeat", {})

        self._heartbeats = asyncio.create_task(beat())

    async def bind(self) -> None:
        """Bind the host's durable pull consumer (the scheduler made it at registration)."""
        assert self.nc is not None
        js = self.nc.jetstream()
        self._psub = await js.pull_subscribe_bind(
            durable=self.subjects.consumer(self.host_id), stream=self.subjects.assignments_stream
        )

    async def assignments(self, count: int, *, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """The next `count` assignments (acked), waiting up to `timeout` seconds in all.

        Raises:
            TimeoutError: fewer arrived in time.
        """
        assert self._psub is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[dict[str, Any]] = []
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"{self.host_id}: {len(out)} of {count} assignments after {timeout:g} s")
            try:
                msgs = await self._psub.fetch(min(count - len(out), 256), timeout=min(2.0, left))
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                out.append(json.loads(msg.data))
        return out

    async def claim(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        """Claim the attempt of `assignment`."""
        return await self.request("claim", lease_of(assignment))

    async def close(self) -> None:
        """Stop heartbeating, unbind, close the connection."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        if self._psub is not None:
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
