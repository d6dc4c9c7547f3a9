"""NATS helpers shared by the scheduler, the agent and the client.

`request` is the client side of every endpoint: encode, carry the trace, send, turn an error reply into
the typed error, decode. `typed_handler` is the server side: handlers take and return models and raise
`DevschedError`s; the mapping onto the protocol's error replies happens here and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.micro.request import Handler, Request
from nats.micro.service import EndpointManager
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import BaseModel

from devsched.core.backoff import backoff_delay
from devsched.core.errors import DevschedError, Internal, InvalidRequest, TooLarge
from devsched.protocol.codec import decode, encode, encode_error, raise_for_error
from devsched.protocol.tracing import extract, inject, messaging_attributes, tracer, use_context

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

#: A typed endpoint handler: the validated request and the concrete subject (which names the host).
TypedHandler = Callable[[Req, str], Awaitable[BaseModel]]

#: Default payload limit (`DEVSCHED_MAX_PAYLOAD_BYTES`): below NATS's 1 MiB so the 413 reply is ours.
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024


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
    span_attributes = messaging_attributes(subject, "send", len(data))
    with tracer().start_as_current_span(f"send {subject}", kind=SpanKind.CLIENT, attributes=span_attributes):
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
) -> Handler:
    """Wrap a model-in, model-out coroutine as a nats-py `micro` endpoint handler.

    The payload size is checked first (`TooLarge`, 413), then the body is decoded (`InvalidRequest`,
    400, with paths), then `await handler(model, subject)` runs inside the caller's trace context and
    its model is the reply. A `DevschedError` becomes its error reply; any other exception is logged
    and answered as `internal` (500) without its text, which could leak internals.

    Error replies are sent by this wrapper, not raised to `micro`, because `micro`'s `ServiceError`
    path sends no body; so `nats micro stats` counts them as successful requests.
    """

    async def handle(req: Request) -> None:
        subject = req.subject
        data = req.data
        context = extract(req.headers)
        span_attributes = messaging_attributes(subject, "process", len(data))
        with (
            use_context(context),
            tracer().start_as_current_span(
                f"process {subject}", kind=SpanKind.SERVER, attributes=span_attributes
            ) as span,
        ):
            try:
                if len(data) > max_payload_bytes:
                    raise TooLarge(
                        f"payload of {len(data)} bytes is above the limit of {max_payload_bytes}",
                        size=len(data),
                        limit=max_payload_bytes,
                    )
                reply = encode(await handler(decode(request_type, data), subject))
            except DevschedError as err:
                _record(span, err)
                headers, body = encode_error(err)
                await req.respond(body, headers=headers)
                return
            except Exception as exc:
                log.exception("unhandled error serving %s", subject)
                span.record_exception(exc)
                internal = Internal()
                _record(span, internal)
                headers, body = encode_error(internal)
                await req.respond(body, headers=headers)
                return
            await req.respond(reply)

    return handle


def _record(span: trace.Span, err: DevschedError) -> None:
    span.set_attribute("devsched.error.code", err.code)
    if err.status >= 500:
        span.set_status(Status(StatusCode.ERROR, err.code))


async def add_typed_endpoint(
    service: EndpointManager,
    *,
    name: str,
    subject: str,
    request_type: type[Req],
    handler: TypedHandler[Req],
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **endpoint_options: Any,
) -> None:
    """`service.add_endpoint` with a `typed_handler`.

    Pass the micro `Service` itself with the full subjects of `Subjects`: a micro `Group` prefixes its
    name to every endpoint subject. Give the service `queue_group=Subjects.queue_group` so that every
    replica shares the load.
    """
    await service.add_endpoint(
        name=name,
        subject=subject,
        handler=typed_handler(request_type, handler, max_payload_bytes=max_payload_bytes),
        **endpoint_options,
    )
