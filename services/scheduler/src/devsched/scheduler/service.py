"""The NATS micro service `P-scheduler`: every endpoint, concurrency, and a draining stop.

nats-py runs one subscription's callbacks one after another, so a micro endpoint would serve one
request at a time per process. The `Dispatcher` hands each request to its own task instead, bounded
by a semaphore (when it is full the callback waits, and requests queue in NATS's per-subscription
buffer), and knows which requests are in flight so a shutdown can wait for them. Before that, every
request passes the `Admission` checks: a reply subject of the requester's own, and the host's fair share.
Artifact commits, which wait on their host's chunks, run in a `Lane` of their own instead of the slots.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import nats.micro
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.micro.request import Handler, Request
from nats.micro.service import Service

from devsched.core.errors import TooManyRequests
from devsched.protocol.codec import ERROR_HEADER, encode_error
from devsched.protocol.endpoints import HOST_ARTIFACT, handlers
from devsched.protocol.subjects import Subjects
from devsched.protocol.transport import EndpointTally, add_typed_endpoint, reply_limit
from devsched.scheduler.admission import Admission
from devsched.scheduler.api import Api, observed
from devsched.scheduler.metrics import reply_counter, request_timer
from devsched.service import flush_subscriptions

log = logging.getLogger("devsched.scheduler.service")


def _version() -> str:
    try:
        return version("devsched-scheduler")
    except PackageNotFoundError:  # running from a source tree without metadata
        return "0.0.0"


def _reply_of(req: Request) -> str | None:
    # micro's Request does not expose the reply subject; its message does.
    return req._msg.reply or None


#: The pause a host refused by a full `Lane` is told to wait.
LANE_RETRY_AFTER_S = 1.0


@dataclass(slots=True)
class Lane:
    """A small pool of its own for requests that wait on their host (artifact commits), off the shared slots.

    A commit waits for its host's chunks: in the shared slots, a few hosts trickling chunks would hold every
    slot that renewals need. A lane holds at most `limit` requests, `per_host` of one host; more are
    refused 429 at once rather than queued.
    """

    limit: int
    per_host: int
    running: int = 0
    by_host: Counter[str] = field(default_factory=Counter)

    def enter(self, host_id: str) -> bool:
        """Take a place for a request of `host_id`; False when the lane or the host's part of it is full."""
        if self.running >= self.limit or self.by_host[host_id] >= self.per_host:
            return False
        self.running += 1
        self.by_host[host_id] += 1
        return True

    def leave(self, host_id: str) -> None:
        """Give back the place of a finished request of `host_id`."""
        self.running -= 1
        self.by_host[host_id] -= 1
        if self.by_host[host_id] <= 0:
            del self.by_host[host_id]


class Dispatcher:
    """Runs each admitted request in its own task, at most `limit` at once (plus those of its lanes)."""

    def __init__(self, limit: int, admission: Admission | None = None) -> None:
        self._slots = asyncio.Semaphore(limit)
        #: Each request's task, with the host whose fair share it holds (None: an operator's request).
        self._running: dict[asyncio.Task[None], str | None] = {}
        #: The tasks that run in a lane instead of a slot, with the lane and the host they count against.
        self._in_lane: dict[asyncio.Task[None], tuple[Lane, str]] = {}
        self.admission = admission

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        return len(self._running)

    def wrap(
        self,
        handler: Handler,
        *,
        host_of: Callable[[str], str] | None = None,
        tally: EndpointTally | None = None,
        lane: Lane | None = None,
    ) -> Handler:
        """A micro handler that admits a request and starts `handler` for it in a task, returning at once.

        `host_of` (host endpoints) names the requesting host from the subject; without it the endpoint is
        an operator's. A request whose reply subject is not the requester's inbox is dropped unanswered;
        a host over its fair share is answered 429 at once (counted in `tally`, the endpoint's stats).
        With `lane`, the request runs in that lane instead of a slot, or is answered 429 when it is full.
        """
        admission = self.admission

        async def dispatch(req: Request) -> None:
            host_id: str | None = None
            if admission is not None:
                reply = _reply_of(req)
                if host_of is None:
                    if not admission.operator_reply_allowed(req.subject, reply):
                        return
                else:
                    try:
                        host_id = host_of(req.subject)
                    except ValueError:
                        # No host has this id (NATS permissions are made for valid ids only): the handler
                        # answers 400, and only to an operator's inbox.
                        if not admission.operator_reply_allowed(req.subject, reply):
                            return
                    else:
                        if not admission.host_reply_allowed(host_id, req.subject, reply):
                            return
                        retry_after_s = admission.take(host_id, req.subject)
                        if retry_after_s is not None:
                            await _refuse(req, retry_after_s, tally)
                            return
            if lane is not None:
                await self._start_in_lane(req, handler, lane, host_id, host_of, tally)
                return
            await self._slots.acquire()
            task: asyncio.Task[None] = asyncio.ensure_future(handler(req))
            self._running[task] = host_id
            task.add_done_callback(self._finished)

        return dispatch

    async def _start_in_lane(
        self,
        req: Request,
        handler: Handler,
        lane: Lane,
        host_id: str | None,
        host_of: Callable[[str], str] | None,
        tally: EndpointTally | None,
    ) -> None:
        key = host_id
        if key is None and host_of is not None:
            try:
                key = host_of(req.subject)
            except ValueError:
                key = ""  # the handler answers 400
        if not lane.enter(key or ""):
            if host_id is not None and self.admission is not None:
                self.admission.give_back(host_id)
            await _refuse(req, LANE_RETRY_AFTER_S, tally, what="artifact commits in flight (of this host, or in all)")
            return
        task: asyncio.Task[None] = asyncio.ensure_future(handler(req))
        self._running[task] = host_id
        self._in_lane[task] = (lane, key or "")
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        # The fair share is given back here, not in the task: one coroutine fewer per request (issue 10).
        host_id = self._running.pop(task, None)
        in_lane = self._in_lane.pop(task, None)
        if in_lane is None:
            self._slots.release()
        else:
            in_lane[0].leave(in_lane[1])
        if host_id is not None and self.admission is not None:
            self.admission.give_back(host_id)
        if not task.cancelled() and task.exception() is not None:  # typed_handler answers everything
            log.error("request task failed", exc_info=task.exception())

    async def wait_idle(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bound for shutdown
        """Wait until no request is in flight, up to `timeout` seconds; True when idle."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)
        return not self._running


@functools.lru_cache(maxsize=1024)
def _too_many_requests(retry_after_ms: int, what: str = "requests from this host") -> tuple[dict[str, str], bytes]:
    # A flooding host gets thousands of these a second: each distinct pause is encoded once.
    retry_after_s = retry_after_ms / 1000
    err = TooManyRequests(f"too many {what}; retry after {retry_after_s} s", retry_after_s=retry_after_s)
    return encode_error(err)


async def _refuse(
    req: Request, retry_after_s: float, tally: EndpointTally | None, *, what: str = "requests from this host"
) -> None:
    retry_after_ms = max(1, round(retry_after_s * 1000))
    headers, body = _too_many_requests(retry_after_ms, what)
    try:
        await req.respond(body, headers=dict(headers))
    except Exception as exc:  # the connection is going away; the host retries after its timeout
        log.debug("429 not sent: %s", type(exc).__name__)
        return
    if tally is not None:
        tally.error(TooManyRequests(headers[ERROR_HEADER]), headers)


async def start_service(
    nc: Client,
    api: Api,
    subjects: Subjects,
    dispatcher: Dispatcher,
    *,
    max_payload_bytes: int,
    commit_lane: Lane | None = None,
) -> Service:
    """Add the micro service with every endpoint in the deployment's queue group.

    Artifact commits run in `commit_lane` when given, else in the dispatcher's slots like any request.
    Every reply is bounded by the server's `max_payload` (`reply_limit`).
    """
    service = await nats.micro.add_service(
        nc,
        name=subjects.service_name,
        version=_version(),
        description="devsched control plane: tasks, hosts and leases",
        metadata={"prefix": subjects.prefix},
        queue_group=subjects.queue_group,
    )
    for endpoint, handler in handlers(api):
        host_of = api.host_id_of if endpoint.host else None
        lane = commit_lane if endpoint is HOST_ARTIFACT else None
        await add_typed_endpoint(
            service,
            name=endpoint.name,
            subject=subjects.served(endpoint),
            request_type=endpoint.request,
            handler=observed(endpoint.name, handler),
            max_payload_bytes=max_payload_bytes,
            hand_off=functools.partial(_dispatched, dispatcher, host_of, endpoint.name, lane),
            reply_type=endpoint.reply,
            max_reply_bytes=functools.partial(reply_limit, nc),
        )
    return service


def _dispatched(
    dispatcher: Dispatcher,
    host_of: Callable[[str], str] | None,
    name: str,
    lane: Lane | None,
    handler: Handler,
    tally: EndpointTally,
) -> Handler:
    tally.observe = request_timer(name)  # the typed handler's own timing, from its start to its reply
    tally.count = reply_counter(name)  # every reply, a 429 of the dispatcher's too
    return dispatcher.wrap(handler, host_of=host_of, tally=tally, lane=lane)


def endpoints_registered(service: Service) -> int:
    """How many endpoints the micro service lists (all of `ENDPOINTS` while it serves, none once stopped)."""
    return len(service.info().endpoints)


def _endpoint_subscriptions(service: Service) -> list[Subscription]:
    # micro has no public way to drain its endpoints (Service.stop unsubscribes, and cancels handlers
    # running in the subscription's task); reach for the subscriptions, and fall back if that changes.
    subscriptions = []
    for endpoint in getattr(service, "_endpoints", []):
        sub = getattr(endpoint, "_subscription", None)
        if isinstance(sub, Subscription):
            subscriptions.append(sub)
    return subscriptions


async def _drain_endpoint(nc: Client, sub: Subscription) -> None:
    # `Subscription.drain` sends UNSUB through the client's pending buffer and then flushes, and the flush's
    # PING can overtake the UNSUB (see `flush_subscriptions`): the server may still route requests to this
    # replica after the drain has removed the subscription, and the client drops them. So: UNSUB first,
    # wait until the server has processed it (and delivered what it routed here before), then drain.
    send_unsubscribe = getattr(nc, "_send_unsubscribe", None)
    sid = getattr(sub, "_id", None)
    if send_unsubscribe is not None and sid is not None:
        await send_unsubscribe(sid)
        await flush_subscriptions(nc)
    await sub.drain()  # type: ignore[no-untyped-call]


async def stop_taking_requests(nc: Client, service: Service) -> None:
    """Unsubscribe every endpoint, then hand the requests NATS had already delivered to the dispatcher.

    Another replica in the queue group gets every request sent after this; none is dropped here.
    """
    subscriptions = _endpoint_subscriptions(service)
    if not subscriptions:
        await service.stop()
        return
    results = await asyncio.gather(*(_drain_endpoint(nc, sub) for sub in subscriptions), return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            log.warning("endpoint drain failed: %s", type(result).__name__)
