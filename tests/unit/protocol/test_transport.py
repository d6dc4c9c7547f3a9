"""The transport helpers against fakes of nats-py's Request and Client (no server)."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import pytest
from opentelemetry import trace
from pydantic import BaseModel

from devsched.core.errors import DevschedError, Internal, LeaseForeign, NotFound, Unavailable
from devsched.core.status import TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import ERROR_CODE_HEADER, ERROR_HEADER, encode, encode_error
from devsched.protocol.tracing import TRACEPARENT, extract, use_context
from devsched.protocol.transport import NoReply, request, typed_handler

pytestmark = pytest.mark.unit

TASK_ID = uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11")
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SUBJECT = "devsched.api.tasks.get"


@dataclass
class FakeRequest:
    """What `typed_handler` uses of `nats.micro.request.Request`."""

    data: bytes
    subject: str = SUBJECT
    headers: dict[str, str] | None = None
    replies: list[tuple[bytes, dict[str, str] | None]] = field(default_factory=list)

    async def respond(self, data: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.replies.append((data, headers))

    @property
    def reply(self) -> tuple[bytes, dict[str, str] | None]:
        assert len(self.replies) == 1, "exactly one reply per request"
        return self.replies[0]


class Recorder:
    def __init__(self, result: BaseModel | Exception) -> None:
        self.result = result
        self.calls: list[tuple[BaseModel, str]] = []
        self.trace_ids: list[int] = []

    async def __call__(self, req: m.GetTaskRequest, subject: str) -> BaseModel:
        self.calls.append((req, subject))
        self.trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


REPLY = m.CancelReply(task_id=TASK_ID, status=TaskStatus.QUEUED, cancel_requested=False)
GET = encode(m.GetTaskRequest(task_id=TASK_ID))


async def serve(req: FakeRequest, handler: Recorder, limit: int = 1024) -> None:
    await typed_handler(m.GetTaskRequest, handler, max_payload_bytes=limit)(req)  # type: ignore[arg-type]


def error_of(req: FakeRequest) -> tuple[str, dict[str, Any]]:
    data, headers = req.reply
    assert headers is not None
    body = json.loads(data)
    assert headers[ERROR_CODE_HEADER]
    assert headers[ERROR_HEADER]
    return headers[ERROR_CODE_HEADER], body["error"]


# -- typed_handler -----------------------------------------------------------------------------------------


async def test_handler_gets_the_model_and_subject_and_its_reply_is_sent() -> None:
    handler, req = Recorder(REPLY), FakeRequest(GET)
    await serve(req, handler)
    assert handler.calls == [(m.GetTaskRequest(task_id=TASK_ID), SUBJECT)]
    assert req.reply == (encode(REPLY), None)


async def test_size_is_checked_before_anything_else() -> None:
    handler, req = Recorder(REPLY), FakeRequest(b"\xff" * 1025)  # not even UTF-8
    await serve(req, handler)
    status, error = error_of(req)
    assert (status, error["code"]) == ("413", "too_large")
    assert error["details"] == {"size": 1025, "limit": 1024}
    assert handler.calls == []


async def test_exactly_the_limit_is_allowed() -> None:
    body = GET + b" " * (1024 - len(GET))
    handler, req = Recorder(REPLY), FakeRequest(body)
    await serve(req, handler)
    assert req.reply == (encode(REPLY), None)


async def test_a_bad_body_gets_400_with_paths() -> None:
    handler, req = Recorder(REPLY), FakeRequest(b'{"task_id": "nope", "extra": 1}')
    await serve(req, handler)
    status, error = error_of(req)
    assert (status, error["code"]) == ("400", "invalid_request")
    assert sorted(e["path"] for e in error["details"]["errors"]) == ["extra", "task_id"]
    assert handler.calls == []


async def test_a_devsched_error_becomes_its_reply() -> None:
    req = FakeRequest(GET, subject="devsched.host.h2.renew")
    await serve(req, Recorder(LeaseForeign("the lease belongs to h1", owner="h1")))
    status, error = error_of(req)
    assert (status, error) == (
        "409",
        {"code": "lease_foreign", "message": "the lease belongs to h1", "details": {"owner": "h1"}},
    )
    assert req.reply[1] == encode_error(LeaseForeign("the lease belongs to h1", owner="h1"))[0]


async def test_an_unexpected_exception_is_internal_and_leaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    req = FakeRequest(GET)
    with caplog.at_level(logging.ERROR, logger="devsched.protocol.transport"):
        await serve(req, Recorder(RuntimeError("password=hunter2")))
    status, error = error_of(req)
    assert (status, error["code"], error["details"]) == ("500", "internal", {})
    assert b"hunter2" not in req.reply[0]
    assert "hunter2" not in json.dumps(req.reply[1])
    assert any("hunter2" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_the_handler_runs_in_the_callers_trace() -> None:
    handler, req = Recorder(REPLY), FakeRequest(GET, headers={TRACEPARENT: PARENT})
    await serve(req, handler)
    assert handler.trace_ids == [int(PARENT.split("-")[1], 16)]
    assert not trace.get_current_span().get_span_context().is_valid  # detached afterwards


async def test_without_trace_headers_the_handler_has_no_parent() -> None:
    handler = Recorder(REPLY)
    await serve(FakeRequest(GET), handler)
    assert handler.trace_ids == [0]


# -- request -----------------------------------------------------------------------------------------------


@dataclass
class FakeMsg:
    data: bytes
    headers: dict[str, str] | None = None


class FakeClient:
    """Answers `request` from a script: each item is a reply or an exception to raise."""

    def __init__(self, *script: FakeMsg | Exception) -> None:
        self.script = list(script)
        self.sent: list[tuple[str, bytes, float, dict[str, str] | None]] = []

    async def request(
        self,
        subject: str,
        payload: bytes,
        timeout: float,  # noqa: ASYNC109 - the signature of nats-py's Client.request
        headers: dict[str, str] | None = None,
    ) -> FakeMsg:
        self.sent.append((subject, payload, timeout, headers))
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


async def call(nc: FakeClient, **kwargs: Any) -> m.CancelReply:
    return await request(
        nc,  # type: ignore[arg-type]
        SUBJECT,
        m.GetTaskRequest(task_id=TASK_ID),
        m.CancelReply,
        timeout=0.5,
        backoff=0.001,
        **kwargs,
    )


async def test_request_encodes_sends_and_decodes() -> None:
    nc = FakeClient(FakeMsg(encode(REPLY)))
    assert await call(nc) == REPLY
    assert nc.sent == [(SUBJECT, GET, 0.5, None)]


async def test_request_raises_the_typed_error() -> None:
    headers, body = encode_error(NotFound("no such task", task_id=str(TASK_ID)))
    with pytest.raises(NotFound) as raised:
        await call(FakeClient(FakeMsg(body, headers)))
    assert raised.value.details == {"task_id": str(TASK_ID)}


async def test_request_does_not_retry_by_default() -> None:
    nc = FakeClient(nats.errors.TimeoutError(), FakeMsg(encode(REPLY)))
    with pytest.raises(NoReply) as raised:
        await call(nc)
    assert len(nc.sent) == 1
    assert raised.value.details == {"subject": SUBJECT, "reason": "timeout"}
    assert isinstance(raised.value, DevschedError)
    assert raised.value.retryable


async def test_request_retries_timeouts_and_no_responders_when_asked() -> None:
    nc = FakeClient(nats.errors.TimeoutError(), nats.errors.NoRespondersError(), FakeMsg(encode(REPLY)))
    assert await call(nc, retries=2) == REPLY
    assert len(nc.sent) == 3


async def test_request_gives_up_after_its_retries() -> None:
    nc = FakeClient(nats.errors.TimeoutError(), nats.errors.NoRespondersError())
    with pytest.raises(NoReply, match="no_responders"):
        await call(nc, retries=1)


async def test_request_never_retries_error_replies() -> None:
    headers, body = encode_error(Unavailable())
    nc = FakeClient(FakeMsg(body, headers), FakeMsg(encode(REPLY)))
    with pytest.raises(Unavailable):
        await call(nc, retries=3)
    assert len(nc.sent) == 1


async def test_a_malformed_reply_is_internal_not_invalid_request() -> None:
    with pytest.raises(Internal, match="malformed CancelReply") as raised:
        await call(FakeClient(FakeMsg(b'{"task_id": 1}')))
    assert raised.value.details["errors"]


async def test_request_carries_the_current_trace_and_extra_headers() -> None:
    nc = FakeClient(FakeMsg(encode(REPLY)))
    with use_context(extract({TRACEPARENT: PARENT})):
        await call(nc, headers={"X-Test": "1"})
    headers = nc.sent[0][3]
    assert headers is not None
    assert headers["X-Test"] == "1"
    assert headers[TRACEPARENT].split("-")[1] == PARENT.split("-")[1]  # same trace
