"""devsched.protocol.transport against a real nats-server: typed micro endpoints and `request()`."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import nats.micro
import pytest
from nats.aio.client import Client
from nats.micro.request import Handler, Request
from opentelemetry import trace

from devsched.core.errors import InvalidRequest, LeaseForeign, NotFound, ReplyTooLarge, TooLarge
from devsched.core.status import TaskStatus
from devsched.embedded import ChildProcess, free_port
from devsched.embedded.server import tcp_accepts
from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.codec import ERROR_CODE_HEADER, ERROR_HEADER
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.protocol.tracing import TRACEPARENT, extract, use_context
from devsched.protocol.transport import EndpointTally, HandOff, NoReply, add_typed_endpoint, request
from support.polling import eventually

NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not NATS_SERVER.exists(), reason=f"no nats-server at {NATS_SERVER}"),
]

LIMIT = 1024
TASK_ID = uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11")
LEASE_ID = uuid.UUID("5e1d2c3b-4a59-4687-9a1b-2c3d4e5f6a7b")
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def own_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server of this module's own, on a free port, stopped by its pid afterwards."""
    port = free_port()
    store = tmp_path_factory.mktemp("js")
    cmd = [str(NATS_SERVER), "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
    server = ChildProcess("nats-server", cmd, None, store.parent / f"{store.name}.log").start()
    try:
        server.wait_ready(lambda: tcp_accepts("127.0.0.1", port), timeout=10)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
async def nc(own_nats_url: str) -> AsyncIterator[Client]:
    """Overrides the shared `nc`: this module runs its own nats-server and needs nothing else."""
    client = await nats.connect(own_nats_url, connect_timeout=2, max_reconnect_attempts=0)
    yield client
    await client.close()


@pytest.fixture
def subjects() -> Subjects:
    return Subjects(f"t{uuid.uuid4().hex[:10]}")


class Scheduler:
    """A stand-in scheduler: the typed endpoints, recording what they saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    async def get(self, req: m.GetTaskRequest, subject: str) -> m.CancelReply:
        self.seen.append((subject, trace.get_current_span().get_span_context().trace_id))
        if req.task_id != TASK_ID:
            raise NotFound("no such task", task_id=str(req.task_id))
        return m.CancelReply(task_id=req.task_id, status=TaskStatus.QUEUED, cancel_requested=False)

    async def claim(self, req: m.ClaimRequest, subject: str) -> m.LeaseReply:
        prefix = subject.split(".", 1)[0]
        host_id = Subjects(prefix).host_id_of(subject)
        self.seen.append((subject, 0))
        if host_id != "h1":
            raise LeaseForeign(f"the lease belongs to h1, not {host_id}", owner="h1")
        return m.LeaseReply(expires_at=datetime.now(UTC) + timedelta(seconds=30), ttl_s=30, cancel_requested=False)


@pytest.fixture
async def scheduler(nc: Client, subjects: Subjects) -> AsyncIterator[Scheduler]:
    """The typed endpoints served as one micro service, the way the scheduler does it."""
    scheduler = Scheduler()
    svc = await nats.micro.add_service(
        nc, name=subjects.service_name, version="0.1.0", queue_group=subjects.queue_group
    )
    # Endpoints go on the service itself: a micro Group would prefix our already complete subjects.
    await add_typed_endpoint(
        svc,
        name="tasks-get",
        subject=subjects.endpoint(endpoints.TASKS_GET),
        request_type=m.GetTaskRequest,
        handler=scheduler.get,
        max_payload_bytes=LIMIT,
    )
    await add_typed_endpoint(
        svc,
        name="host-claim",
        subject=subjects.served(endpoints.HOST_CLAIM),
        request_type=m.ClaimRequest,
        handler=scheduler.claim,
        max_payload_bytes=LIMIT,
    )
    yield scheduler
    await svc.stop()


async def test_a_typed_endpoint_answers(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    reply = await request(
        nc, subjects.endpoint(endpoints.TASKS_GET), m.GetTaskRequest(task_id=TASK_ID), m.CancelReply, timeout=2
    )
    assert reply == m.CancelReply(task_id=TASK_ID, status=TaskStatus.QUEUED, cancel_requested=False)
    assert scheduler.seen[0][0] == subjects.endpoint(endpoints.TASKS_GET)


async def test_a_bad_body_gets_400_with_headers_and_paths(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    msg = await nc.request(subjects.endpoint(endpoints.TASKS_GET), b'{"task_id": "nope", "bogus": 1}', timeout=2)
    assert msg.headers is not None
    assert msg.headers[ERROR_CODE_HEADER] == "400"
    assert msg.headers[ERROR_HEADER].startswith("invalid request")
    error = json.loads(msg.data)["error"]
    assert error["code"] == "invalid_request"
    assert sorted(e["path"] for e in error["details"]["errors"]) == ["bogus", "task_id"]
    assert scheduler.seen == []


async def test_a_duplicate_key_gets_400(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    body = f'{{"task_id": "{TASK_ID}", "task_id": "{TASK_ID}"}}'.encode()
    msg = await nc.request(subjects.endpoint(endpoints.TASKS_GET), body, timeout=2)
    assert msg.headers is not None
    assert msg.headers[ERROR_CODE_HEADER] == "400"


async def test_an_oversize_body_gets_413(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    msg = await nc.request(subjects.endpoint(endpoints.TASKS_GET), b" " * (LIMIT + 1), timeout=2)
    assert msg.headers is not None
    assert msg.headers[ERROR_CODE_HEADER] == "413"
    assert json.loads(msg.data)["error"]["details"] == {"size": LIMIT + 1, "limit": LIMIT}
    # Through request(): the size is checked before the schema (a CancelRequest is the wrong type here).
    big = m.CancelRequest(task_id=TASK_ID, reason="x" * LIMIT)
    with pytest.raises(TooLarge):
        await request(nc, subjects.endpoint(endpoints.TASKS_GET), big, m.CancelReply, timeout=2)
    assert scheduler.seen == []


async def test_request_raises_the_typed_error(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    other = uuid.uuid4()
    with pytest.raises(NotFound) as raised:
        await request(
            nc, subjects.endpoint(endpoints.TASKS_GET), m.GetTaskRequest(task_id=other), m.CancelReply, timeout=2
        )
    assert raised.value.message == "no such task"
    assert raised.value.details == {"task_id": str(other)}
    with pytest.raises(InvalidRequest) as invalid:
        await request(nc, subjects.endpoint(endpoints.TASKS_GET), m.ListTasksRequest(), m.CancelReply, timeout=2)
    assert "task_id" in [e["path"] for e in invalid.value.details["errors"]]


async def test_host_wildcard_endpoint_sees_the_concrete_subject(
    nc: Client, subjects: Subjects, scheduler: Scheduler
) -> None:
    claim = m.ClaimRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID)
    reply = await request(nc, subjects.host("h1", HostVerb.CLAIM), claim, m.LeaseReply, timeout=2)
    assert reply.ttl_s == 30
    with pytest.raises(LeaseForeign) as raised:
        await request(nc, subjects.host("h2", HostVerb.CLAIM), claim, m.LeaseReply, timeout=2)
    assert raised.value.details == {"owner": "h1"}
    assert [s for s, _ in scheduler.seen] == [subjects.host("h1", "claim"), subjects.host("h2", "claim")]


async def test_the_trace_crosses_the_request(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    with use_context(extract({TRACEPARENT: PARENT})):
        await request(
            nc, subjects.endpoint(endpoints.TASKS_GET), m.GetTaskRequest(task_id=TASK_ID), m.CancelReply, timeout=2
        )
    assert scheduler.seen == [(subjects.endpoint(endpoints.TASKS_GET), int(PARENT.split("-")[1], 16))]


async def test_no_responders_is_no_reply(nc: Client, subjects: Subjects) -> None:
    with pytest.raises(NoReply) as raised:
        await request(
            nc,
            subjects.endpoint(endpoints.TASKS_GET),
            m.GetTaskRequest(task_id=TASK_ID),
            m.CancelReply,
            timeout=1,
            retries=1,
            backoff=0.01,
        )
    assert raised.value.details["reason"] == "no_responders"


async def test_the_service_is_discoverable(nc: Client, subjects: Subjects, scheduler: Scheduler) -> None:
    msg = await nc.request(f"$SRV.INFO.{subjects.service_name}", b"", timeout=2)
    info = json.loads(msg.data)
    assert info["name"] == subjects.service_name
    assert {(e["name"], e["subject"], e["queue_group"]) for e in info["endpoints"]} == {
        ("tasks-get", subjects.endpoint(endpoints.TASKS_GET), subjects.queue_group),
        ("host-claim", subjects.served(endpoints.HOST_CLAIM), subjects.queue_group),
    }


# -- what `nats micro stats` reports -----------------------------------------------------------------------

HANDLER_S = 0.05


async def micro_stats(nc: Client, service_name: str, endpoint: str) -> dict[str, Any]:
    """The endpoint's entry of `$SRV.STATS.<name>`: the request `nats micro stats <name>` sends."""
    reply = await nc.request(f"$SRV.STATS.{service_name}", b"", timeout=2)
    stats = json.loads(reply.data)
    return next(e for e in stats["endpoints"] if e["name"] == endpoint)


def in_a_task(handler: Handler, tally: EndpointTally) -> Handler:
    """A hand-off like the scheduler's dispatcher: micro's callback returns before the request is served."""
    running: set[asyncio.Task[None]] = set()

    async def dispatch(req: Request) -> None:
        task = asyncio.ensure_future(handler(req))
        running.add(task)
        task.add_done_callback(running.discard)

    return dispatch


@pytest.mark.parametrize("hand_off", [None, in_a_task], ids=["in-micro", "handed-off"])
async def test_micro_stats_count_error_replies_and_time_the_whole_handler(
    nc: Client, subjects: Subjects, hand_off: HandOff | None
) -> None:
    async def slow_get(req: m.GetTaskRequest, subject: str) -> m.CancelReply:
        await asyncio.sleep(HANDLER_S)
        if req.task_id != TASK_ID:
            raise NotFound("no such task", task_id=str(req.task_id))
        return m.CancelReply(task_id=req.task_id, status=TaskStatus.QUEUED, cancel_requested=False)

    svc = await nats.micro.add_service(
        nc, name=subjects.service_name, version="0.1.0", queue_group=subjects.queue_group
    )
    try:
        tally = await add_typed_endpoint(
            svc,
            name="tasks-get",
            subject=subjects.endpoint(endpoints.TASKS_GET),
            request_type=m.GetTaskRequest,
            handler=slow_get,
            hand_off=hand_off,
        )
        assert tally.attached, "nats-py's micro Endpoint changed: see transport._micro_endpoint"
        codes: list[int] = []
        tally.count = codes.append
        await request(
            nc, subjects.endpoint(endpoints.TASKS_GET), m.GetTaskRequest(task_id=TASK_ID), m.CancelReply, timeout=2
        )
        with pytest.raises(NotFound):
            await request(
                nc,
                subjects.endpoint(endpoints.TASKS_GET),
                m.GetTaskRequest(task_id=uuid.uuid4()),
                m.CancelReply,
                timeout=2,
            )
        bad = await nc.request(subjects.endpoint(endpoints.TASKS_GET), b"not json", timeout=2)
        assert bad.headers is not None
        assert bad.headers[ERROR_CODE_HEADER] == "400"

        # The tally records right after the reply went out: poll until the third one is in.
        async def counted() -> dict[str, Any] | None:
            stats = await micro_stats(nc, subjects.service_name, "tasks-get")
            return stats if stats["num_errors"] == 2 else None

        stats = await eventually(counted, message="both error replies counted")
        assert stats["num_requests"] == 3
        assert stats["last_error"].startswith("400:invalid_request ")
        # Two requests slept HANDLER_S each; micro's own timer saw only the hand-off in the second case.
        assert stats["processing_time"] >= 2 * HANDLER_S * 1e9
        assert stats["average_processing_time"] >= (2 * HANDLER_S / 3) * 1e9
        assert stats["average_processing_time"] == stats["processing_time"] // 3
        assert sorted(codes) == [200, 400, 404], "every reply counted by its status"
    finally:
        await svc.stop()


async def test_micro_stats_last_error_names_status_code_and_message(nc: Client, subjects: Subjects) -> None:
    async def missing(req: m.GetTaskRequest, subject: str) -> m.CancelReply:
        raise NotFound("no such task", task_id=str(req.task_id))

    svc = await nats.micro.add_service(
        nc, name=subjects.service_name, version="0.1.0", queue_group=subjects.queue_group
    )
    try:
        await add_typed_endpoint(
            svc,
            name="tasks-get",
            subject=subjects.endpoint(endpoints.TASKS_GET),
            request_type=m.GetTaskRequest,
            handler=missing,
        )
        with pytest.raises(NotFound):
            await request(
                nc, subjects.endpoint(endpoints.TASKS_GET), m.GetTaskRequest(task_id=TASK_ID), m.CancelReply, timeout=2
            )
        stats = await micro_stats(nc, subjects.service_name, "tasks-get")
        assert (stats["num_requests"], stats["num_errors"]) == (1, 1)
        assert stats["last_error"] == "404:not_found no such task"
    finally:
        await svc.stop()


@pytest.mark.parametrize(("reply_bytes", "max_reply_bytes"), [(4096, 2048), (1100 * 1024, None)])
async def test_a_reply_too_large_to_send_is_an_error_reply_not_silence(
    nc: Client, subjects: Subjects, reply_bytes: int, max_reply_bytes: int | None
) -> None:
    async def huge(req: m.ListTasksRequest, subject: str) -> m.ListTasksReply:
        return m.ListTasksReply(tasks=[], next="x" * reply_bytes)

    svc = await nats.micro.add_service(nc, name=subjects.service_name, version="0.1.0")
    try:
        await add_typed_endpoint(
            svc,
            name="tasks-list",
            subject=subjects.endpoint(endpoints.TASKS_LIST),
            request_type=m.ListTasksRequest,
            handler=huge,
            max_reply_bytes=(lambda: max_reply_bytes) if max_reply_bytes is not None else None,
        )
        # Above the budget we set, or (no budget) above the server's max_payload, which nats-py refuses to send.
        msg = await nc.request(subjects.endpoint(endpoints.TASKS_LIST), b"{}", timeout=5)
        assert msg.headers is not None
        assert msg.headers[ERROR_CODE_HEADER] == "500"
        error = json.loads(msg.data)["error"]
        assert error["code"] == "reply_too_large"
        assert error["details"]["endpoint"] == subjects.endpoint(endpoints.TASKS_LIST)
        assert error["details"]["size"] > reply_bytes
        with pytest.raises(ReplyTooLarge):
            await request(
                nc, subjects.endpoint(endpoints.TASKS_LIST), m.ListTasksRequest(), m.ListTasksReply, timeout=5
            )
    finally:
        await svc.stop()
