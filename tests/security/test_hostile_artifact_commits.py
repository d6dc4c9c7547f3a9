"""Artifact commits cannot hold the scheduler: hosts that trickle their chunks, or send a bad chunk header.

The real scheduler process runs with only 4 request slots (`max_concurrency`) and a 3 s commit deadline.
Three hosts each start two commits of uploads whose chunks arrive one every second and never all: six
commits waiting on chunks, more than every request slot. Meanwhile a steady host renews its lease the
ordinary way (no failure, p99 under a third of its ttl), another host's artifact commit is stored, a third
commit of a trickling host is refused 429 at once, and every trickling commit ends `upload_timeout` (408)
within its deadline with its chunks purged. A chunk whose `Devsched-Chunk` header is `²` is a 400 naming
the header, not a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.protocol.artifacts import CHUNK_BYTES, CHUNK_HEADER, chunk_count, upload_msg_id
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    call,
    delete_streams,
    raw_request,
    scheduler_process,
    service_env,
    submit,
)

pytestmark = [pytest.mark.security, pytest.mark.e2e]

TTL_S = 3
RENEW_EVERY_S = 0.1
COMMIT_TIMEOUT_S = 3.0
#: Each trickling upload has this many chunks, and publishes one a second (never the last).
TRICKLE_CHUNKS = 8
TRICKLING_HOSTS = 3


async def claimed_lease(nc: NatsClient, prefix: str, host: TestHost, ttl_s: int) -> dict[str, Any]:
    await host.register(f"{host.host_id}-d1")
    await submit(nc, prefix, selector={"device_id": f"{host.host_id}-d1"}, lease_ttl_s=ttl_s)
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    return assigned.lease


def upload_subject(host: TestHost, lease: dict[str, Any], upload_id: str) -> str:
    return Subjects(host.prefix).host_upload(host.host_id, lease["task_id"], lease["attempt"], upload_id)


async def publish_chunk(host: TestHost, subject: str, upload_id: str, index: int, data: bytes, header: str) -> None:
    headers = {CHUNK_HEADER: header, MSG_ID_HEADER: upload_msg_id(upload_id, index)}
    await host.js.publish(subject, data, headers=headers)


def commit_body(lease: dict[str, Any], name: str, size: int, sha256: str, upload_id: str) -> dict[str, Any]:
    return {
        **lease,
        "name": name,
        "step": "run",
        "size": size,
        "sha256": sha256,
        "chunks": chunk_count(size),
        "upload_id": upload_id,
    }


async def trickle(host: TestHost, lease: dict[str, Any], upload_id: str) -> None:
    """Publish the upload's chunks one a second, all but the last (cancelled by the test)."""
    subject = upload_subject(host, lease, upload_id)
    for index in range(TRICKLE_CHUNKS - 1):
        await publish_chunk(host, subject, upload_id, index, b"\0" * CHUNK_BYTES, str(index))
        await asyncio.sleep(1.0)


async def commit(host: TestHost, body: dict[str, Any]) -> tuple[float, dict[str, Any] | ErrorReply]:
    started = time.monotonic()
    try:
        reply: dict[str, Any] | ErrorReply = await call(
            host.nc, host.subject("artifact"), body, timeout=COMMIT_TIMEOUT_S + 10
        )
    except ErrorReply as err:
        reply = err
    return time.monotonic() - started, reply


async def object_chunks(nc: NatsClient, prefix: str) -> int:
    info = await nc.jetstream().stream_info(f"OBJ_{Subjects(prefix).artifacts_bucket}")
    return info.state.messages


async def test_trickling_commits_hold_no_request_slot_and_end_at_their_deadline(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    env = service_env(
        database_url,
        nats_url,
        subject_prefix,
        db_pool_size=6,
        max_concurrency=4,
        artifact_commit_timeout_s=COMMIT_TIMEOUT_S,
        artifact_commits_per_host=2,
        artifact_commit_slots=8,
    )
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    hosts: list[TestHost] = []
    tricklers: list[asyncio.Task[None]] = []
    try:
        await scheduler.wait_logged("serving")
        steady, honest = TestHost(nc, subject_prefix, "steady"), TestHost(nc, subject_prefix, "honest")
        slow = [TestHost(nc, subject_prefix, f"trickler{i}") for i in range(TRICKLING_HOSTS)]
        hosts += [steady, honest, *slow]
        steady_lease = await claimed_lease(nc, subject_prefix, steady, TTL_S)
        honest_lease = await claimed_lease(nc, subject_prefix, honest, 60)
        slow_leases = [await claimed_lease(nc, subject_prefix, h, 60) for h in slow]

        size = CHUNK_BYTES * TRICKLE_CHUNKS
        commits: list[asyncio.Task[tuple[float, dict[str, Any] | ErrorReply]]] = []
        for host, lease in zip(slow, slow_leases, strict=True):
            for n in range(2):
                upload_id = secrets.token_hex(8)
                tricklers.append(asyncio.create_task(trickle(host, lease, upload_id)))
                body = commit_body(lease, f"slow-{n}.bin", size, "0" * 64, upload_id)
                commits.append(asyncio.create_task(commit(host, body)))
        await asyncio.sleep(0.5)  # every trickling commit is waiting on its chunks now

        # A third commit of a trickling host: refused at once, not queued.
        extra_upload = secrets.token_hex(8)
        elapsed, extra = await commit(slow[0], commit_body(slow_leases[0], "extra.bin", size, "0" * 64, extra_upload))
        assert isinstance(extra, ErrorReply), extra
        assert (extra.status, extra.code) == (429, "too_many_requests"), extra
        assert extra.details["retry_after_s"] > 0
        assert elapsed < 1.0, f"the 429 took {elapsed:.2f} s"

        # Another host's commit is stored while the six wait.
        data = os.urandom(CHUNK_BYTES + 11)
        upload_id = secrets.token_hex(8)
        subject = upload_subject(honest, honest_lease, upload_id)
        for index in range(chunk_count(len(data))):
            chunk = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
            await publish_chunk(honest, subject, upload_id, index, chunk, str(index))
        body = commit_body(honest_lease, "good.bin", len(data), hashlib.sha256(data).hexdigest(), upload_id)
        elapsed, stored = await commit(honest, body)
        assert isinstance(stored, dict), stored
        assert stored["size"] == len(data)
        assert elapsed < 2.0, f"the honest commit took {elapsed:.2f} s"

        # The steady host's renewals, while six commits wait on chunks and four request slots exist.
        latencies: list[float] = []
        failures: list[str] = []
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                await call(nc, steady.subject("renew"), steady_lease, timeout=TTL_S)
            except Exception as exc:
                failures.append(repr(exc))
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(max(0.0, RENEW_EVERY_S - (time.monotonic() - started)))
        assert failures == [], failures[:5]
        p99 = statistics.quantiles(latencies, n=100)[98]
        assert p99 < TTL_S / 3, f"steady host's renewal p99 {p99:.3f} s"

        results = await asyncio.wait_for(asyncio.gather(*commits), timeout=COMMIT_TIMEOUT_S + 15)
        for elapsed, reply in results:
            assert isinstance(reply, ErrorReply), reply
            assert (reply.status, reply.code) == (408, "upload_timeout"), reply
            assert elapsed < COMMIT_TIMEOUT_S + 2.0, f"a trickling commit ended after {elapsed:.2f} s"
        for task in tricklers:
            task.cancel()
        await asyncio.gather(*tricklers, return_exceptions=True)
        # The honest file's chunks and meta are all the bucket holds: the trickled chunks were purged.
        assert await object_chunks(nc, subject_prefix) == chunk_count(len(data)) + 1
        print(
            f"\n{len(commits)} trickling commits ended in {max(e for e, _ in results):.2f} s at most; steady host: "
            f"{len(latencies)} renewals, p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
        )

        # A chunk header of a Unicode digit: a 400 naming the header.
        upload_id = secrets.token_hex(8)
        await publish_chunk(honest, upload_subject(honest, honest_lease, upload_id), upload_id, 0, b"x", "²")
        reply_msg = await raw_request(
            nc,
            honest.subject("artifact"),
            json.dumps(commit_body(honest_lease, "sq.bin", 1, hashlib.sha256(b"x").hexdigest(), upload_id)).encode(),
            timeout=10,
        )
        assert reply_msg.headers is not None
        assert reply_msg.headers["Nats-Service-Error-Code"] == "400", reply_msg.data
        error = json.loads(reply_msg.data)["error"]
        assert error["details"]["errors"][0]["path"] == f"headers.{CHUNK_HEADER}", error
        assert "²" not in error["message"], "the submitted value is not echoed"
    finally:
        for task in tricklers:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tricklers, return_exceptions=True)
        for host in hosts:
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)
