"""Storage budgets per host: one host filling its logs or its uploads costs no other host a byte.

The real scheduler process runs with small budgets: `max_hosts` 4, so each host's logs stream holds 1 MiB
(`logs_max_bytes` 4 MiB) and its uploads stream 1 MiB. Host A writes four times its share of well-formed
records into its own log subject, and publishes four times its upload share of chunks it never commits.
Meanwhile host B renews its lease, writes 512 KiB of output (half before the flood, half during it) and
stores an artifact. B's output reads back in full through the client's log reader, B's artifact is stored,
B's renewals stay fast; A's oldest records are the ones evicted and A's extra chunks the ones refused. A
fifth host is refused 507 `storage_full`, and a scheduler whose budgets exceed the JetStream store does not
start.

The flood is run again with the deploy accounts (deploy/nats/accounts.conf): the flooder writes through its
own account's imports, as a real host would, and the operator user reads B's output by a log filter.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import APIError

from devsched.client.logs import LogReader, collect_output
from devsched.protocol import messages as m
from devsched.protocol.artifacts import CHUNK_BYTES, CHUNK_HEADER, chunk_count, upload_msg_id
from devsched.protocol.codec import decode, encode
from devsched.protocol.logs import DataEncoding, LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    call,
    delete_streams,
    get_task,
    scheduler_process,
    service_env,
    submit,
)
from support.secured_nats import PREFIX, SCHEDULER_SETTINGS, SecuredNats, account_host, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.e2e]

KiB = 1024
MiB = 1024 * KiB
MAX_HOSTS = 4
SHARE = 1 * MiB
#: The budgets of the test: each host's logs and uploads streams hold SHARE bytes.
BUDGETS: dict[str, object] = {
    "max_hosts": MAX_HOSTS,
    "logs_max_bytes": MAX_HOSTS * SHARE,
    "uploads_max_bytes": MAX_HOSTS * SHARE,
    "artifact_max_file_bytes": 512 * KiB,
    "events_max_bytes": 16 * MiB,
    "artifacts_max_bytes": 16 * MiB,
}
#: Host B's lease, renewed every RENEW_EVERY_S during the flood: each renewal must come within TTL_S / 3.
TTL_S = 3
RENEW_EVERY_S = 0.1
RECORD_BYTES = 4 * KiB


def record(task_id: uuid.UUID, seq: int, data: str) -> LogRecord:
    return LogRecord(
        task_id=task_id,
        attempt=1,
        seq=seq,
        kind=LogKind.OUTPUT,
        at=datetime.now(UTC),
        offset=(seq - 1) * len(data),
        step="run",
        index=0,
        stream=OutputStream.STDOUT,
        encoding=DataEncoding.UTF8,
        data=data,
    )


async def write_output(host: TestHost, lease: dict[str, Any], total: int, letter: str, *, first_seq: int = 1) -> bytes:
    """`total` bytes of output records on the host's own log subject of its lease's attempt, acked one by one,
    numbered from `first_seq`."""
    subjects = Subjects(host.prefix)
    task_id = uuid.UUID(lease["task_id"])
    subject = subjects.host_log(host.host_id, task_id, lease["attempt"])
    written = []
    for seq in range(first_seq, first_seq + total // RECORD_BYTES):
        data = f"{letter}{seq:07d}".ljust(RECORD_BYTES - 1, letter) + "\n"
        headers = {MSG_ID_HEADER: log_msg_id(lease["lease_id"], seq)}
        await host.js.publish(subject, encode(record(task_id, seq, data)), headers=headers)
        written.append(data.encode())
    return b"".join(written)


async def upload(host: TestHost, lease: dict[str, Any], data: bytes) -> tuple[str, int]:
    """Publish `data` as an upload's chunks on the host's own subject; its id and how many were refused."""
    upload_id = secrets.token_hex(8)
    subject = Subjects(host.prefix).host_upload(host.host_id, lease["task_id"], lease["attempt"], upload_id)
    refused, reasons = 0, set[str]()
    for index in range(chunk_count(len(data))):
        chunk = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        headers = {CHUNK_HEADER: str(index), MSG_ID_HEADER: upload_msg_id(upload_id, index)}
        try:
            await host.js.publish(subject, chunk, headers=headers)
        except APIError as exc:
            reasons.add(str(exc).lower())
            refused += 1
    assert all("maximum bytes" in reason for reason in reasons), reasons
    return upload_id, refused


async def claimed_lease(nc: NatsClient, prefix: str, host: TestHost) -> dict[str, Any]:
    await host.register(f"{host.host_id}-d1")
    await submit(nc, prefix, selector={"device_id": f"{host.host_id}-d1"}, lease_ttl_s=TTL_S * 20)
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    return dict(assigned.lease)


async def renewals_during(
    nc: NatsClient, host: TestHost, lease: dict[str, Any], flood: asyncio.Task[Any]
) -> list[float]:
    latencies: list[float] = []
    while not flood.done() or len(latencies) < 10:
        started = time.monotonic()
        await call(nc, host.subject("renew"), lease, timeout=TTL_S)
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, RENEW_EVERY_S - (time.monotonic() - started)))
    return latencies


async def flood_while_another_host_works(
    operator: NatsClient,
    streams: JetStreamContext,
    flooder: TestHost,
    flood_lease: dict[str, Any],
    honest: TestHost,
    lease: dict[str, Any],
) -> str:
    """A floods its logs and uploads while B writes output (before and during the flood), renews its lease
    and stores an artifact; asserts B lost nothing and A only its own. Returns a summary line.

    `operator` calls the API and reads B's output and artifact; `streams` reads the streams' state. Each host
    speaks through its own `nc`.
    """
    subjects = Subjects(honest.prefix)
    # B's output before the flood and during it (256 KiB each), A's flood of 4x its share, B renewing all along
    half = 256 * KiB
    before = await write_output(honest, lease, half, "b")
    flood = asyncio.create_task(write_output(flooder, flood_lease, 4 * SHARE, "a"))
    during = asyncio.create_task(write_output(honest, lease, half, "c", first_seq=half // RECORD_BYTES + 1))
    latencies = await renewals_during(honest.nc, honest, lease, flood)
    await flood
    expected = before + await during
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < TTL_S / 3, f"the honest host's renewal p99 {p99:.3f} s during the flood"

    own = await streams.stream_info(subjects.host_logs_stream(flooder.host_id))
    assert own.state.bytes <= SHARE, "the flooder's stream holds its share at most"
    assert own.state.first_seq > 1, "the flooder's own oldest records are the ones evicted"
    assert own.state.last_seq == 4 * SHARE // RECORD_BYTES, "and its latest are kept"

    async def probe() -> m.TaskView:
        return decode(m.TaskView, json.dumps(await get_task(operator, honest.prefix, lease["task_id"])).encode())

    reader = LogReader(operator.jetstream(), subjects, uuid.UUID(lease["task_id"]), probe, attempt=1)
    assert await collect_output(reader) == expected, "the honest host's 512 KiB read back in full"

    # Uploads: A's chunks past its share are refused, never committed; B's artifact is stored.
    _, refused = await upload(flooder, flood_lease, os.urandom(4 * SHARE))
    assert refused >= chunk_count(3 * SHARE), f"only {refused} of the flooder's chunks were refused"
    data = os.urandom(300 * KiB)
    upload_id, none_refused = await upload(honest, lease, data)
    assert none_refused == 0, "the honest host's chunks are stored"
    body = {
        **lease,
        "name": "out/b.bin",
        "step": "run",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "chunks": chunk_count(len(data)),
        "upload_id": upload_id,
    }
    stored = await call(honest.nc, honest.subject("artifact"), body, timeout=10)
    bucket = await operator.jetstream().object_store(subjects.artifacts_bucket)
    assert (await bucket.get(stored["object"])).data == data
    return (
        f"{4 * SHARE} bytes of logs into a {SHARE}-byte share (kept {own.state.bytes}, first seq "
        f"{own.state.first_seq}), {refused} chunks refused; honest host: {len(latencies)} renewals, "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    )


async def test_a_host_filling_its_logs_and_uploads_costs_another_host_nothing(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    env = service_env(database_url, nats_url, subject_prefix, **BUDGETS)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    hosts: list[TestHost] = []
    try:
        await scheduler.wait_logged("serving")
        flooder, honest = TestHost(nc, subject_prefix, "flooder"), TestHost(nc, subject_prefix, "honest")
        hosts += [flooder, honest]
        flood_lease = await claimed_lease(nc, subject_prefix, flooder)
        lease = await claimed_lease(nc, subject_prefix, honest)
        print("\nflood:", await flood_while_another_host_works(nc, nc.jetstream(), flooder, flood_lease, honest, lease))

        # One host more than max_hosts has no room: refused, and the others keep theirs.
        for name in ("third", "fourth"):
            hosts.append(TestHost(nc, subject_prefix, name))
            await hosts[-1].register(f"{name}-d1", bind=False)
        one_more = TestHost(nc, subject_prefix, "fifth")
        hosts.append(one_more)
        with pytest.raises(ErrorReply) as caught:
            await one_more.register("fifth-d1", bind=False)
        assert (caught.value.status, caught.value.code) == (507, "storage_full")
        assert "max_hosts" in caught.value.message
        await honest.register(f"{honest.host_id}-d1", bind=False)  # a host that has its streams registers again
    finally:
        for host in hosts:
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)


async def test_a_scheduler_whose_budgets_exceed_the_store_does_not_start(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    env = service_env(database_url, nats_url, subject_prefix, **BUDGETS, jetstream_store_bytes=32 * MiB)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    try:
        assert await scheduler.wait_exit(timeout=30) == 2
        lines = [line for line in scheduler.log_text().splitlines() if "JetStream storage budget" in line]
        assert len(lines) == 1, scheduler.tail()
        assert "more than the 33554432 bytes of the store" in lines[0], lines[0]
        assert not scheduler.logged("serving")
    finally:
        scheduler.kill()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def test_a_host_filling_its_logs_and_uploads_costs_another_host_nothing_with_the_deploy_accounts(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    env = service_env(database_url, secured.url("scheduler"), PREFIX, **BUDGETS, **SCHEDULER_SETTINGS)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    connections: list[NatsClient] = []
    try:
        await scheduler.wait_logged("serving")
        operator = await nats.connect(secured.url("operator"))
        scheduler_user = await nats.connect(secured.url("scheduler"))  # only it reads a host stream's state
        connections += [operator, scheduler_user]
        flooder, flooder_connection = await account_host(secured, "bench-07")
        honest, honest_connection = await account_host(secured, "bench-08")
        connections += [flooder.nc, honest.nc]
        flood_lease = await claimed_lease(operator, PREFIX, flooder)
        lease = await claimed_lease(operator, PREFIX, honest)
        summary = await flood_while_another_host_works(
            operator, scheduler_user.jetstream(), flooder, flood_lease, honest, lease
        )
        assert flooder_connection.violations == [], "the flood used only the flooder's own subjects"
        assert honest_connection.violations == []
        print("\nflood with the deploy accounts:", summary)
    finally:
        for nc in connections:
            await nc.close()
        scheduler.kill()
