"""Artifacts in (issue 12): a host's commit moves its uploaded chunks into the artifacts bucket.

A host cannot write to the bucket: an Object Store's chunk subjects (`$O.<bucket>.C.<nuid>`) cannot be
confined to one host. It publishes a file's chunks on its own upload subject (its own stream
`<PU>_UPLOADS_<host_id>`, which holds its share of the uploads budget) and
commits them here (`P.host.<host_id>.artifact`). The scheduler then

1. refuses a file above `artifact_max_file_bytes` (`artifact_too_large`), a chunk count that does not fit
   the size, and, in the store (`admit_artifact`, under the task's lock), a lease that is not the
   committing host's live one, or an attempt whose artifacts would exceed `artifact_max_attempt_bytes`
   (`artifact_quota_exceeded`);
2. reads the chunks from the committing host's own subject, in order (a repeated chunk is skipped), and
   writes them as an object's chunks while hashing them, refusing a gap, a chunk of the wrong size, or a
   total size or SHA-256 other than committed (`upload_mismatch`): the chunks written are purged and no
   object exists;
3. writes the object's meta (the object is then complete), records the row (the same checks again, so
   commits that raced cannot pass the cap together; on a refusal the object is deleted), deletes the object
   a re-upload of the same name replaced, and purges the upload.

A commit has a deadline (`artifact_commit_timeout_s`): a host trickling its chunks gets `upload_timeout`
and its chunks are purged. Every commit charges its host what it purged (`devsched.core.uploadrate`): a
host whose commits purged more than its share within the window has its next commits refused 429
`too_many_requests` for the window, before anything is read or purged (its stream stays full, and
JetStream refuses its further chunks). The account is this replica's own.
Commits run in a lane of their own (`service.Lane`), not in the request slots.
A chunk whose `Devsched-Chunk` header is not a plain ASCII number is a 400 naming the header.

The object is `<task_id>/<attempt>/<upload_id>` in bucket `<PU>_ARTIFACTS`, written in the format of the
NATS Object Store (nats-py and the `nats` CLI read it), its description the artifact's name.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import time
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from devsched.core.errors import ArtifactTooLarge, TooManyRequests, UploadMismatch, UploadTimeout
from devsched.core.records import LeaseRef
from devsched.core.uploadrate import UploadCharges
from devsched.core.views import ArtifactView
from devsched.protocol import messages as m
from devsched.protocol.artifacts import CHUNK_BYTES, CHUNK_HEADER, chunk_count, object_name
from devsched.protocol.subjects import Subjects
from devsched.scheduler.metrics import UPLOAD_REFUSALS
from devsched.scheduler.replies import decode_key, encode_key, fit
from devsched.scheduler.settings import UPLOAD_MAX_MSG_BYTES, SchedulerSettings
from devsched.service import bind
from devsched.store import Store

log = logging.getLogger("devsched.scheduler.artifacts")

#: How long the next chunk may take to arrive from the uploads stream (they are all stored before the commit).
_CHUNK_WAIT_S = 5.0
#: Object Store names (nats-py's templates).
_OBJ_STREAM = "OBJ_{bucket}"
_CHUNKS = "$O.{bucket}.C.{nuid}"
_META = "$O.{bucket}.M.{name}"
_ROLLUP = {"Nats-Rollup": "sub"}


def object_stream(bucket: str) -> str:
    """`OBJ_<bucket>`: the stream behind an Object Store bucket."""
    return _OBJ_STREAM.format(bucket=bucket)


def bucket_stream_config(subjects: Subjects, settings: SchedulerSettings) -> api.StreamConfig:
    """The stream of the bucket `<PU>_ARTIFACTS`, as `create_object_store` makes it, with our retention."""
    bucket = subjects.artifacts_bucket
    return api.StreamConfig(
        name=object_stream(bucket),
        description=f"devsched artifacts ({subjects.prefix}): files steps left in DEVSCHED_ARTIFACTS_DIR",
        subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        max_age=settings.artifacts_max_age_s,
        max_bytes=settings.artifacts_max_bytes,
        storage=api.StorageType(settings.stream_storage),
        num_replicas=settings.stream_replicas,
        discard=api.DiscardPolicy.NEW,
        allow_rollup_hdrs=True,
        allow_direct=True,
    )


def uploads_stream_config(subjects: Subjects, settings: SchedulerSettings, host_id: str) -> api.StreamConfig:
    """`<PU>_UPLOADS_<host_id>`: one host's chunks on their way in, `P.host.<host_id>.upload.>`.

    Each upload is purged once committed.
    Short-lived (`uploads_max_age_s`, an hour by default) and bounded by the host's share of the uploads
    budget (`uploads_host_max_bytes`); when full, the host's new chunks are refused (DiscardPolicy NEW)
    rather than its older uploads cut short, and no other host's stream is touched.
    """
    return api.StreamConfig(
        name=subjects.host_uploads_stream(host_id),
        description=f"devsched artifact uploads ({subjects.prefix}) of host {host_id}: chunks until committed",
        subjects=[subjects.host_uploads(host_id)],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType(settings.stream_storage),
        num_replicas=settings.stream_replicas,
        max_age=settings.uploads_max_age_s,
        max_bytes=settings.uploads_host_max_bytes,
        max_msg_size=UPLOAD_MAX_MSG_BYTES,
        duplicate_window=min(settings.duplicate_window_s, settings.uploads_max_age_s),
        discard=api.DiscardPolicy.NEW,
    )


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


class ArtifactIntake:
    """The `P.host.<host_id>.artifact` commit and the operators' listing."""

    def __init__(self, store: Store, nc: Client, js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings):
        self._store = store
        self._nc = nc
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._bucket = subjects.artifacts_bucket
        #: What each host's commits purged over the last window, on this replica.
        self._upload_charges = UploadCharges(settings.upload_share)

    async def commit(self, host_id: str, req: m.ArtifactCommit) -> m.ArtifactView:
        """Store one uploaded file as an artifact of the host's attempt (see the module docstring)."""
        ref = LeaseRef(host_id=host_id, task_id=req.task_id, attempt=req.attempt, lease_id=req.lease_id)
        settings = self._settings
        upload = self._subjects.host_upload(host_id, req.task_id, req.attempt, req.upload_id)
        deadline = asyncio.get_running_loop().time() + settings.artifact_commit_timeout_s
        with bind(host_id=host_id, task_id=req.task_id, attempt=req.attempt, lease_id=req.lease_id):
            self._within_rate(host_id)
            try:
                if req.size > settings.artifact_max_file_bytes:
                    raise ArtifactTooLarge(
                        f"artifact {req.name!r} is {req.size} bytes, above the per-file cap of "
                        f"{settings.artifact_max_file_bytes} bytes",
                        limit=settings.artifact_max_file_bytes,
                        size=req.size,
                    )
                if req.chunks != chunk_count(req.size):
                    raise UploadMismatch(
                        f"{req.size} bytes travel in {chunk_count(req.size)} chunks of {CHUNK_BYTES}, not {req.chunks}"
                    )
                await self._store.admit_artifact(
                    ref, req.name, req.size, max_attempt_bytes=settings.artifact_max_attempt_bytes
                )
                started = time.perf_counter()
                name = object_name(req.task_id, req.attempt, req.upload_id)
                await self._copy_within(deadline, host_id, upload, req, name)
                row = ArtifactView(
                    attempt=req.attempt,
                    name=req.name,
                    step=req.step,
                    size=req.size,
                    sha256=req.sha256,
                    host_id=host_id,
                    stored_at=datetime.now(UTC),
                    object=name,
                )
                try:
                    row, replaced = await self._store.record_artifact(
                        ref, row, max_attempt_bytes=settings.artifact_max_attempt_bytes
                    )
                except BaseException:
                    await self._delete(name)
                    raise
                if replaced is not None:
                    await self._delete(replaced)
            finally:
                self._charge(host_id, await self._purge(host_id, upload))
            log.info(
                "artifact stored",
                extra={
                    "artifact": req.name,
                    "size": req.size,
                    "object": name,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )
            return m.ArtifactView.from_value(row)

    async def _copy_within(self, deadline: float, host_id: str, upload: str, req: m.ArtifactCommit, name: str) -> None:
        """`_copy` by `deadline` (event loop time), the part of a commit that waits on the host's chunks.

        The database steps before and after are left to finish: cut short after the row is recorded, the
        host would be told of a failure while the artifact exists.
        """
        timeout_s = self._settings.artifact_commit_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                await self._copy(host_id, upload, req, name)  # purges what it copied when cut short
        except TimeoutError:
            log.info("artifact commit timed out", extra={"timeout_s": timeout_s})
            raise UploadTimeout(
                f"the commit of {req.name!r} did not complete within {timeout_s} s; its chunks were purged",
                timeout_s=timeout_s,
            ) from None

    async def list(self, req: m.ListArtifactsRequest, budget: int) -> m.ListArtifactsReply:
        """`P.api.tasks.artifacts`: the task's artifacts, and the bucket that holds them, in `budget` bytes."""
        rows = sorted(await self._store.list_artifacts(req.task_id, req.attempt), key=lambda r: (r.attempt, r.name))
        after = decode_key(req.after, (int, str)) if req.after is not None else None
        views = [m.ArtifactView.from_value(r) for r in rows if after is None or (r.attempt, r.name) > after]
        n = fit(views, budget)
        nxt = encode_key([views[n - 1].attempt, views[n - 1].name]) if n < len(views) else None
        return m.ListArtifactsReply(task_id=req.task_id, bucket=self._bucket, artifacts=views[:n], next=nxt)

    async def _copy(self, host_id: str, upload: str, req: m.ArtifactCommit, name: str) -> None:
        """Move the upload's chunks into a new object `name`, checked chunk by chunk, then its meta."""
        nuid = self._nc._nuid.next().decode()
        chunks = _CHUNKS.format(bucket=self._bucket, nuid=nuid)
        digest = hashlib.sha256()
        try:
            size = await self._copy_chunks(host_id, upload, req, chunks, digest) if req.chunks else 0
            if size != req.size or digest.hexdigest() != req.sha256:
                raise UploadMismatch(
                    f"the uploaded bytes of {req.name!r} are not the committed file ({size} bytes, sha256 "
                    f"{digest.hexdigest()}; committed {req.size} bytes, sha256 {req.sha256})"
                )
            info = api.ObjectInfo(
                name=name,
                bucket=self._bucket,
                nuid=nuid,
                size=size,
                chunks=req.chunks,
                digest="SHA-256=" + base64.urlsafe_b64encode(digest.digest()).decode(),
                mtime=datetime.now(UTC).isoformat(),
                description=req.name,
                headers={"Devsched-Step": [req.step], "Devsched-Sha256": [req.sha256]},
                options=api.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
            )
            await self._js.publish(
                _META.format(bucket=self._bucket, name=_b64(name)), json.dumps(info.as_dict()).encode(), headers=_ROLLUP
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self._js.purge_stream(object_stream(self._bucket), subject=chunks)
            raise

    async def _copy_chunks(
        self, host_id: str, upload: str, req: m.ArtifactCommit, chunks: str, digest: hashlib._Hash
    ) -> int:
        """The upload's chunks, in order, published as `chunks`; the bytes copied."""
        stream = self._subjects.host_uploads_stream(host_id)
        sub = await self._js.subscribe(upload, stream=stream, ordered_consumer=True)
        expected, size, last = 0, 0, req.chunks - 1
        pending: list[asyncio.Future[api.PubAck]] = []
        try:
            while expected < req.chunks:
                try:
                    msg: Msg = await sub.next_msg(timeout=_CHUNK_WAIT_S)
                except TimeoutError:
                    raise UploadMismatch(
                        f"chunk {expected} of {req.chunks} of {req.name!r} is missing from the upload"
                    ) from None
                index = _index(msg)
                if index > expected:
                    raise UploadMismatch(f"chunk {expected} of {req.name!r} is missing or out of order")
                if index < expected:
                    continue  # a publish the host retried, stored twice
                want = CHUNK_BYTES if index < last else req.size - CHUNK_BYTES * last
                if len(msg.data) != want:
                    raise UploadMismatch(f"chunk {index} of {req.name!r} holds {len(msg.data)} bytes, not {want}")
                digest.update(msg.data)
                size += len(msg.data)
                pending.append(asyncio.ensure_future(self._js.publish(chunks, msg.data)))
                if len(pending) >= 16:  # a window of acknowledgements in flight
                    await pending.pop(0)
                expected += 1
            for ack in pending:
                await ack
            pending.clear()
            return size
        finally:
            # Wait for the chunks already sent rather than cancel them: a cancelled publish may still be
            # stored, after the caller's purge of a refused copy, and leave a stray chunk in the bucket.
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _delete(self, name: str) -> None:
        """Delete an object, best effort (the bucket's max age removes what is left)."""
        try:
            store = await self._js.object_store(self._bucket)
            await store.delete(name)
        except NotFoundError:
            pass
        except Exception as exc:
            log.warning("object not deleted: %s", type(exc).__name__, extra={"object": name})

    def _within_rate(self, host_id: str) -> None:
        """Refuse the commit of a host past its uploads rate share, before anything is read or purged.

        Raises:
            TooManyRequests: (429) with the seconds until the host may commit again.
        """
        wait_s = self._upload_charges.refused_for(host_id, time.monotonic())
        if wait_s is None:
            return
        UPLOAD_REFUSALS.labels(host_id).inc()
        raise TooManyRequests(
            f"this host's commits purged more than its uploads rate share; retry after {wait_s:.1f} s",
            retry_after_s=round(wait_s, 3),
        )

    def _charge(self, host_id: str, purged: int) -> None:
        """Charge the host the messages its commit purged, each at the largest an uploads stream takes."""
        share = self._upload_charges.share
        total = self._upload_charges.charge(host_id, purged * UPLOAD_MAX_MSG_BYTES, time.monotonic())
        if total is not None:
            log.warning(
                "host's uploads over its rate share: its commits are refused for the window",
                extra={"host_id": host_id, "bytes": total, "window_s": share.window_s},
            )

    async def _purge(self, host_id: str, upload: str) -> int:
        """Purge the upload's chunks from the host's stream; how many messages went (0 when the purge failed)."""
        stream = self._subjects.host_uploads_stream(host_id)
        try:
            reply = await self._js._api_request(
                f"{self._js._prefix}.STREAM.PURGE.{stream}",
                json.dumps({"filter": upload}).encode(),
                timeout=self._js._timeout,
            )
        except Exception as exc:  # the stream's max age removes it
            log.info("upload not purged: %s", type(exc).__name__, extra={"subject": upload})
            return 0
        purged = reply.get("purged")
        return purged if isinstance(purged, int) and purged > 0 else 0


#: Longest chunk index, in digits (a file of the largest size has fewer than 10**9 chunks).
_MAX_INDEX_DIGITS = 9


def _index(msg: Msg) -> int:
    """The chunk's index from its `Devsched-Chunk` header: plain ASCII digits only.

    `str.isdigit` and `int` take other digits too (`²`, Arabic-Indic ...): `int("²")` raises, and was a 500.

    Raises:
        UploadMismatch: (400) the header is missing, not ASCII digits, or too long; it names the header.
    """
    value = (msg.headers or {}).get(CHUNK_HEADER)
    if value is None:
        problem = "missing"
    elif not (value.isascii() and value.isdigit()):
        problem = "not a non-negative number in ASCII digits"
    elif len(value) > _MAX_INDEX_DIGITS:
        problem = f"longer than {_MAX_INDEX_DIGITS} digits"
    else:
        return int(value)
    raise UploadMismatch(
        f"a chunk's {CHUNK_HEADER} header is {problem}",
        errors=[{"path": f"headers.{CHUNK_HEADER}", "message": problem}],
    )
