"""Streaming one stored artifact to the browser, chunk by chunk, straight from the `<PU>_ARTIFACTS` bucket.

The web user may read that bucket (never write it: deploy/nats/accounts.conf). The object's chunks are read
through an ordered consumer and passed on as they come, so a large file never sits in the dashboard's
memory; its size and SHA-256 are checked against what the scheduler recorded as they stream, and a
mismatch ends the response before its last byte (the browser then reports a failed download rather
than saving wrong bytes as complete).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator

import nats.errors
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from devsched.client import Client
from devsched.core.errors import Internal, NotFound
from devsched.protocol.artifacts import ArtifactView

#: Seconds to wait for the next chunk of an object.
CHUNK_WAIT_S = 10.0


async def find(client: Client, task_id: object, attempt: int, name: str) -> tuple[str, ArtifactView]:
    """The bucket and the artifact `name` of `attempt` of the task, as the scheduler lists them.

    Raises:
        NotFound: no such task, attempt or artifact.
    """
    listing = await client.artifacts(str(task_id), attempt=attempt)
    for artifact in listing.artifacts:
        if artifact.attempt == attempt and artifact.name == name:
            return listing.bucket, artifact
    raise NotFound(f"no artifact {name!r} in attempt {attempt}", name=name)


async def open_chunks(client: Client, bucket: str, artifact: ArtifactView) -> AsyncIterator[bytes]:
    """The artifact's bytes, chunk by chunk (checked; see the module's docstring).

    The object's metadata is read before this returns, so a missing object raises here (`NotFound`)
    rather than midway through a response.

    Raises:
        NotFound: the bucket or the object is gone (retention).
    """
    js = client.nc.jetstream()
    try:
        store = await js.object_store(bucket)
        info = await store.get_info(artifact.object)
    except (ObjectNotFoundError, BucketNotFoundError, NotFoundError):
        gone = f"artifact {artifact.name!r} is gone from the bucket (retention)"
        raise NotFound(gone, object=artifact.object) from None
    return _chunks(client, bucket, info.nuid or "", artifact)


async def _chunks(client: Client, bucket: str, nuid: str, artifact: ArtifactView) -> AsyncIterator[bytes]:
    digest, size = hashlib.sha256(), 0
    if artifact.size > 0:
        sub = await client.nc.jetstream().subscribe(
            f"$O.{bucket}.C.{nuid}", stream=f"OBJ_{bucket}", ordered_consumer=True
        )
        try:
            while size < artifact.size:
                try:
                    msg = await sub.next_msg(timeout=CHUNK_WAIT_S)
                except nats.errors.TimeoutError:
                    raise Internal(f"artifact {artifact.name!r} stopped after {size} bytes") from None
                digest.update(msg.data)
                size += len(msg.data)
                if size > artifact.size:
                    break
                yield msg.data
                if msg.metadata.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    if size != artifact.size or digest.hexdigest() != artifact.sha256:
        raise Internal(f"artifact {artifact.name!r} read back as {size} bytes, sha256 {digest.hexdigest()}")
