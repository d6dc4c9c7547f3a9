"""Artifact commits cannot hold the scheduler: hosts that trickle their chunks, or send a bad chunk header.

Behind a nats-server with the deploy accounts (deploy/nats/accounts.conf), each host publishing its chunks
and committing through its own account, the real scheduler process runs with only 4 request slots
(`max_concurrency`) and a 3 s commit deadline. Three hosts each start two commits of uploads whose chunks
arrive one every second and never all: six commits waiting on chunks, more than every request slot.
Meanwhile a steady host renews its lease the ordinary way (no failure, p99 under a third of its ttl),
another host's artifact commit is stored, a third commit of a trickling host is refused 429 at once, and
every trickling commit ends `upload_timeout` (408) within its deadline with its chunks purged. A chunk whose
`Devsched-Chunk` header is `²` is a 400 naming the header, not a 500.

Uploads rate share: a host looping bogus commits (each commit purges its upload's chunks, whatever its
outcome, so each would let it write its whole uploads share again) is refused 429 once its commits purged
more than its share within the window, nothing purged: its stream stays full and JetStream refuses its
further chunks ("maximum bytes exceeded"). Meanwhile another host's artifact is stored and a steady host's
renewals keep their p99; after the window the looping host commits the upload it kept, and it is stored. Run
with the rate share out of reach (`host_upload_bytes_per_s` of a GiB a second), the test fails: nothing
refuses the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError

from devsched.protocol.artifacts import CHUNK_BYTES, CHUNK_HEADER, chunk_count, upload_msg_id
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects
from support.deploy_lab import deploy_lab
from support.scheduler_harness import ErrorReply, TestHost, call, raw_request, submit
from support.secured_nats import SecuredNats, secured_nats
from support.steady_renewals import renew_until

pytestmark = [pytest.mark.security, pytest.mark.e2e]

TTL_S = 3
RENEW_EVERY_S = 0.1
COMMIT_TIMEOUT_S = 3.0
#: Each trickling upload has this many chunks, and publishes one a second (never the last).
TRICKLE_CHUNKS = 8
TRICKLING_HOSTS = 3
TRICKLERS = tuple(f"trickler{i}" for i in range(TRICKLING_HOSTS))


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


async def stop(tricklers: list[asyncio.Task[None]]) -> None:
    """Cancel the trickles still running, and wait for them."""
    for task in tricklers:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.gather(*tricklers, return_exceptions=True)


async def object_chunks(nc: NatsClient, prefix: str) -> int:
    """How many messages the artifacts bucket's stream holds (the operator user may read its info)."""
    info = await nc.jetstream().stream_info(f"OBJ_{Subjects(prefix).artifacts_bucket}")
    return info.state.messages


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats", hosts=("steady", "honest", "looper", *TRICKLERS)) as server:
        yield server


async def test_trickling_commits_hold_no_request_slot_and_end_at_their_deadline(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    settings = {
        "db_pool_size": 6,
        "max_concurrency": 4,
        "artifact_commit_timeout_s": COMMIT_TIMEOUT_S,
        "artifact_commits_per_host": 2,
        "artifact_commit_slots": 8,
    }
    tricklers: list[asyncio.Task[None]] = []
    async with deploy_lab(secured, database_url, tmp_path / "scheduler.log", **settings) as lab:
        try:
            nc, subject_prefix = lab.operator, lab.prefix
            steady, honest = await lab.host("steady"), await lab.host("honest")
            slow = [await lab.host(host_id) for host_id in TRICKLERS]
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
            elapsed, extra = await commit(
                slow[0], commit_body(slow_leases[0], "extra.bin", size, "0" * 64, extra_upload)
            )
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
            until = time.monotonic() + 2.0
            renewed = await renew_until(
                steady, steady_lease, TTL_S, lambda: time.monotonic() >= until, every_s=RENEW_EVERY_S
            )
            summary = renewed.assert_unaffected("steady host")

            results = await asyncio.wait_for(asyncio.gather(*commits), timeout=COMMIT_TIMEOUT_S + 15)
            for elapsed, reply in results:
                assert isinstance(reply, ErrorReply), reply
                assert (reply.status, reply.code) == (408, "upload_timeout"), reply
                assert elapsed < COMMIT_TIMEOUT_S + 2.0, f"a trickling commit ended after {elapsed:.2f} s"
            await stop(tricklers)
            # The honest file's chunks and meta are all the bucket holds: the trickled chunks were purged.
            assert await object_chunks(nc, subject_prefix) == chunk_count(len(data)) + 1
            print(f"\n{len(commits)} trickling commits ended in {max(e for e, _ in results):.2f} s at most; {summary}")

            # A chunk header of a Unicode digit: a 400 naming the header.
            upload_id = secrets.token_hex(8)
            await publish_chunk(honest, upload_subject(honest, honest_lease, upload_id), upload_id, 0, b"x", "²")
            reply_msg = await raw_request(
                honest.nc,
                honest.subject("artifact"),
                json.dumps(
                    commit_body(honest_lease, "sq.bin", 1, hashlib.sha256(b"x").hexdigest(), upload_id)
                ).encode(),
                timeout=10,
            )
            assert reply_msg.headers is not None
            assert reply_msg.headers["Nats-Service-Error-Code"] == "400", reply_msg.data
            error = json.loads(reply_msg.data)["error"]
            assert error["details"]["errors"][0]["path"] == f"headers.{CHUNK_HEADER}", error
            assert "²" not in error["message"], "the submitted value is not echoed"
            for host_id in lab.connections:
                assert lab.violations(host_id) == [], f"{host_id} sent only what its account allows"
        finally:
            await stop(tricklers)


MiB = 1024 * 1024
#: The looping host's uploads: 8 chunks, a MiB, as large as a file may be here.
LOOP_FILE_BYTES = MiB
#: Each host's uploads share: the chunks of one such file, and less than a chunk more.
UPLOAD_SHARE_BYTES = LOOP_FILE_BYTES + 64 * 1024
UPLOAD_RATE: dict[str, Any] = {
    "max_hosts": 8,
    "uploads_max_bytes": 8 * UPLOAD_SHARE_BYTES,
    "artifact_max_file_bytes": LOOP_FILE_BYTES,
    "artifact_max_attempt_bytes": 2 * MiB,
    # 3 MiB a window of 2 s: two bogus commits fit, the third takes the host past its share.
    "host_upload_bytes_per_s": 1.5 * MiB,
    "host_upload_rate_window_s": 2.0,
}
#: What one commit of the looping host's upload is charged: its 8 messages at the largest a message may be.
LOOP_CHARGE = 8 * (CHUNK_BYTES + 4096)
#: How long the loop runs at most (it stops a second after its first 429).
LOOP_S = 6.0


@dataclass
class Loop:
    """What a host looping bogus commits got: each commit's (time, status), what JetStream took and refused."""

    commits: list[tuple[float, int]] = field(default_factory=list)
    refused_elapsed: list[float] = field(default_factory=list)
    chunk_refusals: list[str] = field(default_factory=list)
    written_bytes: int = 0
    #: The upload whose commit was first refused (all its chunks in the stream), and the pause asked then.
    kept: str | None = None
    retry_after_s: float = 0.0
    duration_s: float = 0.0

    @property
    def passed_before_refusal(self) -> int:
        """Commits answered before the first 429."""
        statuses = [status for _, status in self.commits]
        return statuses.index(429) if 429 in statuses else len(statuses)


async def bogus_loop(host: TestHost, lease: dict[str, Any], data: bytes) -> Loop:
    """Upload `data` and commit it with a wrong SHA-256, again and again, as fast as answers come."""
    loop = Loop()
    started = time.monotonic()
    stop_at = started + LOOP_S
    while time.monotonic() < stop_at:
        upload_id = secrets.token_hex(8)
        subject = upload_subject(host, lease, upload_id)
        complete = True
        for index in range(chunk_count(len(data))):
            try:
                chunk = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
                await publish_chunk(host, subject, upload_id, index, chunk, str(index))
            except APIError as exc:
                loop.chunk_refusals.append(exc.description or str(exc))
                complete = False
                break
            loop.written_bytes += len(chunk)
        elapsed, reply = await commit(host, commit_body(lease, "bogus.bin", len(data), "0" * 64, upload_id))
        status = reply.status if isinstance(reply, ErrorReply) else 200
        loop.commits.append((time.monotonic() - started, status))
        if isinstance(reply, ErrorReply) and status == 429:
            loop.refused_elapsed.append(elapsed)
            loop.retry_after_s = float(reply.details["retry_after_s"])
            if loop.kept is None and complete:
                loop.kept = upload_id
                stop_at = min(stop_at, time.monotonic() + 1.0)
    loop.duration_s = time.monotonic() - started
    return loop


async def test_a_host_looping_bogus_commits_is_refused_past_its_upload_rate(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    async with deploy_lab(secured, database_url, tmp_path / "scheduler.log", **UPLOAD_RATE) as lab:
        nc, subject_prefix = lab.operator, lab.prefix
        steady, honest, looper = await lab.host("steady"), await lab.host("honest"), await lab.host("looper")
        steady_lease = await claimed_lease(nc, subject_prefix, steady, TTL_S)
        honest_lease = await claimed_lease(nc, subject_prefix, honest, 60)
        looper_lease = await claimed_lease(nc, subject_prefix, looper, 60)
        data = os.urandom(LOOP_FILE_BYTES)
        scheduler_js = (await lab.connect("scheduler")).jetstream()  # the operator may not read a host's streams

        attack = asyncio.create_task(bogus_loop(looper, looper_lease, data))
        renewals = asyncio.create_task(renew_until(steady, steady_lease, TTL_S, attack.done, every_s=RENEW_EVERY_S))
        await asyncio.sleep(0.3)
        # Another host stores an artifact while the loop runs.
        good = os.urandom(LOOP_FILE_BYTES - 99)
        upload_id = secrets.token_hex(8)
        subject = upload_subject(honest, honest_lease, upload_id)
        for index in range(chunk_count(len(good))):
            chunk = good[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
            await publish_chunk(honest, subject, upload_id, index, chunk, str(index))
        body = commit_body(honest_lease, "good.bin", len(good), hashlib.sha256(good).hexdigest(), upload_id)
        elapsed, stored = await commit(honest, body)
        assert isinstance(stored, dict), stored
        assert elapsed < 2.0, f"the honest commit took {elapsed:.2f} s"

        loop = await asyncio.wait_for(attack, timeout=LOOP_S + 20)
        summary = (await renewals).assert_unaffected("steady host")
        rate = loop.written_bytes / loop.duration_s / MiB
        print(
            f"\nlooping host: {len(loop.commits)} commits in {loop.duration_s:.2f} s, {loop.passed_before_refusal} "
            f"answered before its first 429, {loop.written_bytes / MiB:.1f} MiB written ({rate:.1f} MiB/s), "
            f"{len(loop.chunk_refusals)} chunks refused by JetStream; {summary}"
        )
        # Refused once past its share: 3 MiB a window, 1,056 KiB charged a commit (8 messages at most 132 KiB).
        max_bytes = UPLOAD_RATE["host_upload_bytes_per_s"] * UPLOAD_RATE["host_upload_rate_window_s"]
        assert loop.kept is not None, f"the loop was never refused: {loop.commits[:10]}"
        assert loop.passed_before_refusal <= max_bytes // LOOP_CHARGE + 1, loop.commits
        assert [s for _, s in loop.commits[loop.passed_before_refusal :]] == [429] * len(
            loop.commits[loop.passed_before_refusal :]
        ), "every commit within the window is refused"
        assert max(loop.refused_elapsed) < 1.0, f"a 429 took {max(loop.refused_elapsed):.2f} s"
        assert 0 < loop.retry_after_s <= UPLOAD_RATE["host_upload_rate_window_s"]
        # Nothing purged: the kept upload's chunks fill the stream, and JetStream refuses the host's next ones.
        assert loop.chunk_refusals, "the host's further chunks were refused"
        assert all("maximum bytes" in why for why in loop.chunk_refusals), loop.chunk_refusals[:3]
        uploads = await scheduler_js.stream_info(Subjects(subject_prefix).host_uploads_stream("looper"))
        assert uploads.state.messages == chunk_count(len(data)), "the refused commits purged nothing"

        # After the window the host commits again: the upload it kept is stored, and purged from its stream.
        await asyncio.sleep(loop.retry_after_s)
        body = commit_body(looper_lease, "kept.bin", len(data), hashlib.sha256(data).hexdigest(), loop.kept)
        _, kept = await commit(looper, body)
        assert isinstance(kept, dict), kept
        assert kept["size"] == len(data)
        uploads = await scheduler_js.stream_info(Subjects(subject_prefix).host_uploads_stream("looper"))
        assert uploads.state.messages == 0
        lines = (tmp_path / "scheduler.log").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        over = [r for r in records if r.get("msg", "").startswith("host's uploads over its rate share")]
        assert [r.get("host_id") for r in over] == ["looper"], over
        for host_id in lab.connections:
            assert lab.violations(host_id) == [], f"{host_id} sent only what its account allows"
