"""`P.host.<id>.artifact` over NATS (issue 12): a commit stores the host's uploaded chunks in the bucket,
and every refusal (another host, another lease, bytes that are not the file, over a cap) stores nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from devsched.agent.stop import StopSignal
from devsched.agent.uploads import UploadLimits, uploads_factory
from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.artifacts import CHUNK_BYTES, CHUNK_HEADER, chunk_count, upload_msg_id
from devsched.protocol.codec import decode
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects
from devsched.scheduler.app import Scheduler
from support.scheduler_harness import (
    Assigned,
    ErrorReply,
    TestHost,
    call,
    check,
    delete_streams,
    raw_request,
    running_scheduler,
    scheduler_settings,
    submit,
)

pytestmark = pytest.mark.integration

KiB = 1024
MAX_FILE = 600 * KiB
MAX_ATTEMPT = 900 * KiB


@pytest.fixture
async def scheduler(database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient) -> AsyncIterator[Scheduler]:
    """A scheduler with small artifact caps."""
    settings = scheduler_settings(
        database_url,
        nats_url,
        subject_prefix,
        artifact_max_file_bytes=MAX_FILE,
        artifact_max_attempt_bytes=MAX_ATTEMPT,
    )
    async with running_scheduler(settings) as running:
        yield running
    await delete_streams(nc, subject_prefix)


async def upload(host: TestHost, lease: dict[str, Any], data: bytes, *, as_host: str | None = None) -> str:
    """Publish `data` in chunks on `as_host`'s upload subject (the host's own by default); the upload id."""
    upload_id = secrets.token_hex(8)
    subject = Subjects(host.prefix).host_upload(as_host or host.host_id, lease["task_id"], lease["attempt"], upload_id)
    for index in range(chunk_count(len(data))):
        chunk = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        headers = {CHUNK_HEADER: str(index), MSG_ID_HEADER: upload_msg_id(upload_id, index)}
        await host.js.publish(subject, chunk, headers=headers)
    return upload_id


def commit(lease: dict[str, Any], name: str, data: bytes, upload_id: str, **changes: Any) -> dict[str, Any]:
    return {
        **lease,
        "name": name,
        "step": "run",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "chunks": chunk_count(len(data)),
        "upload_id": upload_id,
        **changes,
    }


async def refused(nc: NatsClient, subject: str, body: dict[str, Any]) -> ErrorReply:
    with pytest.raises(ErrorReply) as caught:
        check(await raw_request(nc, subject, json.dumps(body).encode(), timeout=15))
    return caught.value


async def listing(nc: NatsClient, prefix: str, task_id: str) -> list[dict[str, Any]]:
    reply = await call(nc, Subjects(prefix).endpoint(endpoints.TASKS_ARTIFACTS), {"task_id": task_id})
    return list(reply["artifacts"])


async def objects(nc: NatsClient, prefix: str) -> int:
    info = await nc.jetstream().stream_info(f"OBJ_{Subjects(prefix).artifacts_bucket}")
    return info.state.messages


@pytest.fixture
async def running(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> tuple[TestHost, Assigned]:
    host = make_host()
    await host.register("d1")
    await submit(nc, subject_prefix, lease_ttl_s=60)
    assigned = await host.next_assignment()
    await host.claim(assigned)
    return host, assigned


async def test_a_commit_stores_the_file_and_lists_it(
    running: tuple[TestHost, Assigned], nc: NatsClient, subject_prefix: str
) -> None:
    host, assigned = running
    data = os.urandom(300 * KiB + 7)
    upload_id = await upload(host, assigned.lease, data)
    reply = await host.request("artifact", commit(assigned.lease, "out/a.bin", data, upload_id))
    assert (reply["name"], reply["size"], reply["sha256"]) == ("out/a.bin", len(data), hashlib.sha256(data).hexdigest())
    assert reply["host_id"] == host.host_id
    store = await nc.jetstream().object_store(Subjects(subject_prefix).artifacts_bucket)
    assert (await store.get(reply["object"])).data == data, "the bucket holds the bytes"
    assert [a["name"] for a in await listing(nc, subject_prefix, assigned.task_id)] == ["out/a.bin"]
    uploads = await nc.jetstream().stream_info(Subjects(subject_prefix).host_uploads_stream(host.host_id))
    assert uploads.state.messages == 0, "the upload is purged once committed"

    # the same name again replaces it (and its old object)
    other = os.urandom(10)
    second = await host.request(
        "artifact", commit(assigned.lease, "out/a.bin", other, await upload(host, assigned.lease, other))
    )
    rows = await listing(nc, subject_prefix, assigned.task_id)
    assert [(r["name"], r["size"], r["object"]) for r in rows] == [("out/a.bin", 10, second["object"])]
    assert (await store.get(second["object"])).data == other


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("another host's upload", "upload_mismatch"),
        ("another lease", "lease_superseded"),
        ("bad sha256", "upload_mismatch"),
        ("bad size", "upload_mismatch"),
        ("over the file cap", "artifact_too_large"),
        ("over the attempt cap", "artifact_quota_exceeded"),
        ("a name that climbs out", "invalid_request"),
    ],
)
async def test_a_refused_commit_stores_nothing(
    running: tuple[TestHost, Assigned],
    nc: NatsClient,
    subject_prefix: str,
    make_host: Callable[..., TestHost],
    case: str,
    code: str,
) -> None:
    host, assigned = running
    lease = assigned.lease
    data = os.urandom(200 * KiB)
    stored_before = 0
    if case == "over the attempt cap":
        first = os.urandom(500 * KiB)
        await host.request("artifact", commit(lease, "first.bin", first, await upload(host, lease, first)))
        data = os.urandom(500 * KiB)  # each under the file cap, together over the attempt's
        stored_before = 1
    if case == "over the file cap":
        data = os.urandom(MAX_FILE + 1)
    subject = host.subject("artifact")
    if case == "another host's upload":
        # a neighbour (unconfined here) publishes the chunks; the host commits them under its own lease
        neighbour = make_host()
        await neighbour.register(bind=False)  # its own uploads stream
        upload_id = await upload(host, lease, data, as_host=neighbour.host_id)
    else:
        upload_id = await upload(host, lease, data)
    body = commit(lease, "x.bin", data, upload_id)
    if case == "another lease":
        body["lease_id"] = str(uuid.uuid4())
    elif case == "bad sha256":
        body["sha256"] = hashlib.sha256(b"something else").hexdigest()
    elif case == "bad size":
        body["size"] = len(data) - 1
    elif case == "a name that climbs out":
        body["name"] = "../x.bin"
    objects_before = await objects(nc, subject_prefix)
    err = await refused(nc, subject, body)
    assert err.code == code, err
    assert len(await listing(nc, subject_prefix, assigned.task_id)) == stored_before
    assert await objects(nc, subject_prefix) == objects_before, "no object, no chunk left in the bucket"


@pytest.mark.parametrize("header", ["²", "٣", "-1", "+1", "1e3", "1234567890", "", None])
async def test_a_malformed_chunk_header_is_a_400_naming_the_header(
    running: tuple[TestHost, Assigned], nc: NatsClient, subject_prefix: str, header: str | None
) -> None:
    host, assigned = running
    data = os.urandom(1000)
    upload_id = secrets.token_hex(8)
    subject = Subjects(host.prefix).host_upload(host.host_id, assigned.task_id, assigned.lease["attempt"], upload_id)
    headers = {MSG_ID_HEADER: upload_msg_id(upload_id, 0)}
    if header is not None:
        headers[CHUNK_HEADER] = header
    await host.js.publish(subject, data, headers=headers)
    objects_before = await objects(nc, subject_prefix)
    err = await refused(nc, host.subject("artifact"), commit(assigned.lease, "x.bin", data, upload_id))
    assert (err.status, err.code) == (400, "upload_mismatch"), err
    assert err.details["errors"][0]["path"] == f"headers.{CHUNK_HEADER}"
    assert await objects(nc, subject_prefix) == objects_before
    assert await listing(nc, subject_prefix, assigned.task_id) == []


async def test_another_host_cannot_commit_for_the_attempt(
    running: tuple[TestHost, Assigned], nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    _, assigned = running
    intruder = make_host()
    await intruder.register("d2")
    data = os.urandom(1000)
    upload_id = await upload(intruder, assigned.lease, data)
    err = await refused(nc, intruder.subject("artifact"), commit(assigned.lease, "x.bin", data, upload_id))
    assert err.code == "lease_foreign"
    assert await listing(nc, subject_prefix, assigned.task_id) == []


async def test_after_the_report_nothing_more_is_stored(
    running: tuple[TestHost, Assigned], nc: NatsClient, subject_prefix: str
) -> None:
    host, assigned = running
    await host.report(assigned)
    data = os.urandom(1000)
    err = await refused(
        nc, host.subject("artifact"), commit(assigned.lease, "late.bin", data, await upload(host, assigned.lease, data))
    )
    assert err.code == "task_terminal"
    assert await listing(nc, subject_prefix, assigned.task_id) == []


async def test_the_agent_commits_again_after_a_busy_lane_answers_429(
    database_url: str,
    nats_url: str,
    subject_prefix: str,
    nc: NatsClient,
    make_host: Callable[..., TestHost],
    tmp_path: Path,
) -> None:
    """The host's one commit place is held by a commit whose chunks never come: the agent's commit is answered
    429, waits the pause, and is stored once the held commit ends at its deadline."""
    settings = scheduler_settings(
        database_url, nats_url, subject_prefix, artifact_commits_per_host=1, artifact_commit_timeout_s=2.0
    )
    async with running_scheduler(settings):
        host = make_host()
        await host.register("d1")
        await submit(nc, subject_prefix, lease_ttl_s=60)
        assigned = await host.next_assignment()
        await host.claim(assigned)
        stuck = asyncio.create_task(
            host.request("artifact", commit(assigned.lease, "stuck.bin", b"x" * 10, secrets.token_hex(8)))
        )
        await asyncio.sleep(0.3)  # the stuck commit holds the host's place now
        directory = tmp_path / "artifacts"
        directory.mkdir()
        (directory / "out.txt").write_bytes(b"agent output\n")
        agent_nc = await nats.connect(nats_url, inbox_prefix=f"_INBOX.{host.host_id}")
        try:
            uploads = uploads_factory(
                agent_nc, Subjects(subject_prefix), host.host_id, limits=UploadLimits(), stop_grace_s=5, timeout_s=5
            )(decode(m.Assignment, json.dumps(assigned.body).encode()), directory, None, StopSignal())
            started = time.monotonic()
            summary = await uploads.after_step("run")
            elapsed = time.monotonic() - started
        finally:
            await agent_nc.close()
        assert summary is not None
        assert (summary.stored, summary.failed) == (1, 0), summary
        assert elapsed > 1.0, "it waited for the lane"
        with pytest.raises(ErrorReply) as held:
            await stuck
        assert held.value.code == "upload_timeout"
        assert [a["name"] for a in await listing(nc, subject_prefix, assigned.task_id)] == ["out.txt"]
    await delete_streams(nc, subject_prefix)
