"""NATS helpers shared by the scheduler, the agent and the client.

`request` is the client side of every endpoint: encode, carry the trace, send, turn an error reply into
the typed error, decode. `typed_handler` is the server side: handlers take and return models and raise
`DevschedError`s; the mapping onto the protocol's error replies happens here and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.micro.request import Handler, Request
from nats.micro.service import Service
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import BaseModel

from devsched.core.backoff import backoff_delay
from devsched.core.errors import DevschedError, Internal, InvalidRequest, ReplyTooLarge, TooLarge
from devsched.protocol.codec import ERROR_HEADER, decode, encode, encode_error, raise_for_error, refusal_log_fields
from devsched.protocol.schemas import endpoint_schemas
from devsched.protocol.tracing import extract, inject, messaging_attributes, send_span, span_name, tracer

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

#: A typed endpoint handler: the validated request and the concrete subject (which names the host).
TypedHandler = Callable[[Req, str], Awaitable[BaseModel]]

#: Default payload limit (`DEVSCHED_MAX_PAYLOAD_BYTES`): below NATS's 1 MiB so the 413 reply is ours.
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024
#: The status of a success reply, as `EndpointTally.count` is told it (an error reply's is its error's `status`).
OK_STATUS = 200
#: Bytes of a reply's `max_payload` kept for its headers (trace context, error headers): a reply body is
#: at most `max_payload - REPLY_HEADROOM_BYTES`.
REPLY_HEADROOM_BYTES = 8 * 1024


def reply_limit(nc: Client) -> int:
    """The largest reply body `nc`'s server carries: its `max_payload` (from INFO) less the headers' room."""
    return max(1024, nc.max_payload - REPLY_HEADROOM_BYTES)


class NoReply(DevschedError):
    """No reply: the request timed out or nothing serves the subject.

    Raised on the client side only, never sent on the wire. After a timeout the request may or may not
    have been applied; a retry is safe for the idempotent endpoints (claim, renew, report, cancel,
    get, list) and for a submit with an `idempotency_key`.
    """

    code = "no_reply"
    status = 504
    retryable = True


async def request(
    nc: Client,
    subject: str,
    payload: BaseModel,
    reply_type: type[Rep],
    *,
    timeout: float,  # noqa: ASYNC109 - per try, handed to nats-py; the whole call may take longer
    retries: int = 0,
    backoff: float = 0.2,
    max_backoff: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> Rep:
    """Send `payload` to `subject` and return the decoded reply.

    Args:
        nc: A connected nats-py client.
        subject: The endpoint subject (see `Subjects`).
        payload: The request model.
        reply_type: The model the reply is decoded into.
        timeout: Seconds to wait for each try.
        retries: Extra tries after a NATS timeout or no-responders; 0 (the default) never repeats a
            request, since only the caller knows whether repeating it is safe.
        backoff: Base of the exponential, jittered pause between tries, in seconds.
        max_backoff: Longest pause between tries.
        headers: Extra headers; trace headers are added.

    Raises:
        DevschedError: the typed error of an error reply (`NotFound`, `LeaseExpired`, ...).
        NoReply: every try timed out or found no responders.
        Internal: the reply is not a valid `reply_type`.
    """
    data = encode(payload)
    with send_span(subject, len(data)):
        for attempt in range(retries + 1):
            try:
                msg = await nc.request(subject, data, timeout=timeout, headers=inject(dict(headers or {})) or None)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                if attempt == retries:
                    reason = "timeout" if isinstance(exc, nats.errors.TimeoutError) else "no_responders"
                    raise NoReply(f"no reply from {subject}: {reason}", subject=subject, reason=reason) from exc
                # jittered: many agents retrying after one scheduler restart should not arrive in lockstep
                await asyncio.sleep(backoff_delay(attempt + 1, base_s=backoff, cap_s=max(max_backoff, backoff)))
                continue
            raise_for_error(msg.headers, msg.data)
            try:
                return decode(reply_type, msg.data)
            except InvalidRequest as exc:
                # The server's fault, not the caller's request: do not report it as invalid_request.
                raise Internal(f"malformed {reply_type.__name__} from {subject}", **exc.details) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def typed_handler(
    request_type: type[Req],
    handler: TypedHandler[Req],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    tally: EndpointTally | None = None,
    max_reply_bytes: Callable[[], int] | None = None,
    name: str | None = None,
) -> Handler:
    """Wrap a model-in, model-out coroutine as a nats-py `micro` endpoint handler.

    The payload size is checked first (`TooLarge`, 413), then the body is decoded (`InvalidRequest`,
    400, with paths), then `await handler(model, subject)` runs inside the caller's trace context and
    its model is the reply. A `DevschedError` becomes its error reply; any other exception is logged
    and answered as `internal` (500) without its text, which could leak internals.

    Error replies are sent by this wrapper, not raised to `micro`, because `micro`'s `ServiceError`
    path sends no body; `tally` (see `EndpointTally`) has `nats micro stats` count them as errors anyway,
    and, when the endpoint hands requests off to tasks, time them from here to the reply.

    A reply is never silence: one larger than `max_reply_bytes()` (see `reply_limit`; read per reply, since
    a reconnect may change the server) is answered `reply_too_large` (500) naming the endpoint `name`, and a
    reply NATS refuses to send all the same is answered with that error too.
    """
    endpoint = name or "endpoint"

    async def handle(req: Request) -> None:
        # One coroutine, its span made current by hand: each layer (a second coroutine, the context
        # managers of `use_context` and `start_as_current_span`) costs every request a few microseconds,
        # and the messaging attributes are built only for a span that records them (issue 10).
        started = time.perf_counter_ns()
        subject = req.subject
        data = req.data
        context = extract(req.headers)
        span = tracer().start_span(span_name("process", subject), context=context, kind=SpanKind.SERVER)
        recording = span.is_recording()
        if recording:
            span.set_attributes(messaging_attributes(subject, "process", len(data)))
        token = otel_context.attach(trace.set_span_in_context(span, context))
        error: str | None = None
        status = OK_STATUS
        try:
            try:
                if len(data) > max_payload_bytes:
                    raise TooLarge(
                        f"payload of {len(data)} bytes is above the limit of {max_payload_bytes}",
                        size=len(data),
                        limit=max_payload_bytes,
                    )
                reply = encode(await handler(decode(request_type, data), subject))
                if max_reply_bytes is not None and len(reply) > (limit := max_reply_bytes()):
                    raise _too_large(endpoint, len(reply), limit)
            except DevschedError as err:
                _record(span, err)
                headers, body = encode_error(err)
                await req.respond(body, headers=headers)
                error, status = stats_error(err, headers), err.status
                return
            except Exception as exc:
                log.exception("unhandled error serving %s", subject)
                span.record_exception(exc)
                internal = Internal()
                _record(span, internal)
                headers, body = encode_error(internal)
                await req.respond(body, headers=headers)
                error, status = stats_error(internal, headers), internal.status
                return
            try:
                await req.respond(reply)
            except nats.errors.MaxPayloadError:  # above the server's limit after all (a smaller server)
                too_large = _too_large(endpoint, len(reply), None)
                log.warning("reply of %s not sent: above the server's max_payload", endpoint)
                _record(span, too_large)
                headers, body = encode_error(too_large)
                await req.respond(body, headers=headers)
                error, status = stats_error(too_large, headers), too_large.status
        except Exception as exc:  # the reply could not be sent: recorded as `use_span` would (not a cancellation)
            if recording:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            otel_context.detach(token)
            span.end()
            if tally is not None:
                tally.record(time.perf_counter_ns() - started, error, status)

    return handle


def _too_large(endpoint: str, size: int, limit: int | None) -> ReplyTooLarge:
    return ReplyTooLarge(
        f"the reply of {endpoint} is {size} bytes, more than the NATS server carries; ask for a smaller page or view",
        endpoint=endpoint,
        size=size,
        limit=limit,
    )


def stats_error(err: DevschedError, headers: Mapping[str, str] | None = None) -> str:
    """The `last_error` of `nats micro stats` for an error reply: `"<status>:<code> <message>"`.

    micro's own form is `"<Nats-Service-Error-Code>:<Nats-Service-Error>"` (`404:no such task`); the
    protocol's machine code goes between, so that `409:lease_expired ...` reads at a glance. The message is
    the header's (one line, at most 200 characters), never more than the reply itself said; for an error
    naming fields (`details.errors`), their paths instead (`400:invalid_request metadata.k`): its message may
    quote the value sent, and the stats are read by every operator, not only by the one who sent it.
    """
    paths = refusal_log_fields(err).get("paths")
    message = paths if paths is not None else (headers or encode_error(err)[0]).get(ERROR_HEADER, "")
    return f"{err.status}:{err.code} {message}".rstrip()


def _record(span: trace.Span, err: DevschedError) -> None:
    span.set_attribute("devsched.error.code", err.code)
    if err.status >= 500:
        span.set_status(Status(StatusCode.ERROR, err.code))


#: What an endpoint may put between micro and the typed handler: given the handler and the endpoint's
#: tally, a micro handler that hands each request off (to a task of its own, say) and returns.
HandOff = Callable[[Handler, "EndpointTally"], Handler]


async def add_typed_endpoint(
    service: Service,
    *,
    name: str,
    subject: str,
    request_type: type[Req],
    handler: TypedHandler[Req],
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    hand_off: HandOff | None = None,
    reply_type: type[BaseModel] | None = None,
    max_reply_bytes: Callable[[], int] | None = None,
    **endpoint_options: Any,
) -> EndpointTally:
    """`service.add_endpoint` with a `typed_handler`, whose error replies `nats micro stats` counts.

    Pass the micro `Service` itself with the full subjects of `Subjects` (a micro `Group` prefixes its name
    to every endpoint subject). Give the service `queue_group=Subjects.queue_group` so that every replica
    shares the load. `hand_off` wraps the typed handler when requests run outside micro's callback (the
    scheduler's dispatcher): the endpoint's processing time then covers each request until its reply.
    With `reply_type`, the endpoint's metadata carries its request and reply JSON Schemas (`schemas`), which
    `nats micro info` shows. `max_reply_bytes` bounds every reply (see `typed_handler`). Returns the
    endpoint's tally (for error replies sent outside the typed handler,
    such as a 429).
    """
    tally = EndpointTally(times=hand_off is not None)
    typed = typed_handler(
        request_type,
        handler,
        max_payload_bytes=max_payload_bytes,
        tally=tally,
        max_reply_bytes=max_reply_bytes,
        name=subject,
    )
    if reply_type is not None:
        endpoint_options["metadata"] = {
            **endpoint_schemas(request_type, reply_type),
            **endpoint_options.get("metadata", {}),
        }
    await service.add_endpoint(
        name=name,
        subject=subject,
        handler=typed if hand_off is None else hand_off(typed, tally),
        **endpoint_options,
    )
    tally.attach(service, name)
    return tally


class EndpointTally:
    """Puts into an endpoint's `nats micro stats` what micro cannot see: our error replies and handed-off time.

    nats-py's micro (2.16) counts a request as an error only when its handler raises, and then replies
    without a body; the protocol's error replies carry a JSON body, so they are sent by `typed_handler` and
    micro counts them as successes. And micro times its handler callback, which for a handler that hands the
    request to a task of its own (the scheduler's dispatcher, for concurrency) is only the hand-off.
    `record` adds both to micro's own counters (`_add_to_micro_stats`); with `times` off (micro runs the
    typed handler itself, so it times it whole) only the errors.
    """

    def __init__(self, *, times: bool) -> None:
        self.times = times
        self._endpoint: Any = None
        #: Told of every request's time from the typed handler's start to its reply, in seconds (a metric).
        self.observe: Callable[[float], None] | None = None
        #: Told of every reply's status (`OK_STATUS`, or the error's), those sent outside the typed handler
        #: (a 429) too: the one place every reply of the endpoint is counted by code (a metric).
        self.count: Callable[[int], None] | None = None

    @property
    def attached(self) -> bool:
        """Whether this tally found its micro endpoint's counters (see `_micro_endpoint`)."""
        return self._endpoint is not None

    def attach(self, service: Service, name: str) -> None:
        """Find the micro endpoint `name` of `service`; if nats-py changed, log it and count nothing."""
        self._endpoint = _micro_endpoint(service, name)
        if self._endpoint is None:
            log.warning("nats micro stats of endpoint %s: counters not found; error replies count as successes", name)

    def record(self, elapsed_ns: int, error: str | None, status: int = OK_STATUS) -> None:
        """A request answered after `elapsed_ns` with `status`; `error`: its `stats_error` text, for an error reply."""
        if self.observe is not None:
            self.observe(elapsed_ns / 1e9)
        if self.count is not None:
            self.count(status)
        if self._endpoint is not None:
            _add_to_micro_stats(self._endpoint, elapsed_ns if self.times else 0, error)

    def error(self, err: DevschedError, headers: Mapping[str, str] | None = None) -> None:
        """Count an error reply sent outside the typed handler (micro timed its callback already)."""
        if self.count is not None:
            self.count(err.status)
        if self._endpoint is not None:
            _add_to_micro_stats(self._endpoint, 0, stats_error(err, headers))


#: The private counters of nats-py micro's `Endpoint` (2.16) that `Service.stats()` reports.
MICRO_COUNTERS = ("_num_requests", "_num_errors", "_processing_time", "_average_processing_time", "_last_error")


def _micro_endpoint(service: Service, name: str) -> Any:
    """The micro `Endpoint` object named `name`, if it still has the counters `MICRO_COUNTERS`; else None.

    The one place that reaches into nats-py's micro internals (with `_add_to_micro_stats`): micro has no
    API to count an error whose reply carries a body, nor to time work done after its callback returned.
    tests/integration/test_transport_micro.py fails if a nats-py release changes them.
    """
    owner = getattr(service, "_service", service)  # a micro Group keeps its endpoints in its service
    for endpoint in getattr(owner, "_endpoints", ()):
        if getattr(endpoint, "_name", None) == name:
            if all(isinstance(getattr(endpoint, c, None), int) for c in MICRO_COUNTERS[:3]):
                return endpoint
            return None
    return None


def _add_to_micro_stats(endpoint: Any, elapsed_ns: int, error: str | None) -> None:
    # micro counted the request (and timed its callback) before our handler ran; see `_micro_endpoint`.
    endpoint._processing_time += elapsed_ns
    if endpoint._num_requests:
        endpoint._average_processing_time = endpoint._processing_time // endpoint._num_requests
    if error is not None:
        endpoint._num_errors += 1
        endpoint._last_error = error
