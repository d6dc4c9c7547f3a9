"""Reading a task's artifacts: the listing from the scheduler, the bytes from the bucket.

The scheduler lists them (`P.api.tasks.artifacts`: name, size, SHA-256, step, and the object that holds
each). The bytes are read straight from the Object Store bucket `<PU>_ARTIFACTS` with the caller's own
NATS credentials (operators and the dashboard may read it; hosts may not): the object's metadata, then
its chunks through an ordered consumer (`devsched.client.reader`), passed on as they come so that a large
file is never held whole. Size and SHA-256 are checked against what the scheduler recorded as they
stream: a mismatch raises before the last chunk is passed on, so `download` never puts a wrong file in
place and the dashboard ends its response short (the browser reports a failed download).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from devsched.client.errors import NatsUnreachable
from devsched.client.reader import JetStreamReader
from devsched.core.errors import Internal, NotFound
from devsched.protocol.artifacts import ArtifactView

if TYPE_CHECKING:
    from devsched.client.client import Client

#: Seconds to wait for the next chunk of an object.
CHUNK_WAIT_S = 10.0


def pick(artifacts: list[ArtifactView], name: str, attempt: int | None) -> ArtifactView:
    """The artifact `name` of attempt `attempt`, or of the newest attempt that has one.

    Raises:
        NotFound: no such artifact.
    """
    matches = [a for a in artifacts if a.name == name and (attempt is None or a.attempt == attempt)]
    if not matches:
        where = f" in attempt {attempt}" if attempt is not None else ""
        raise NotFound(f"no artifact {name!r}{where}", name=name)
    return max(matches, key=lambda a: a.attempt)


async def open_chunks(client: Client, bucket: str, artifact: ArtifactView) -> AsyncIterator[bytes]:
    """The artifact's bytes, chunk by chunk, checked (see the module docstring).

    The object's metadata is read before this returns, so a missing object raises here rather than
    midway through the bytes.

    Raises:
        NotFound: the bucket or the object is gone (the bucket's max age removed it).
        NatsUnreachable: NATS or the bucket cannot be read (permissions included).
    """
    return await _open(client.nc.jetstream(), bucket, artifact)


async def read_into(js: JetStreamContext, bucket: str, artifact: ArtifactView, sink: BinaryIO) -> None:
    """Write the artifact's bytes into `sink`, checking its size and SHA-256 as recorded.

    Raises:
        NotFound, NatsUnreachable: as `open_chunks`.
        Internal: the bytes are not what was stored.
    """
    async for chunk in await _open(js, bucket, artifact):
        await asyncio.to_thread(sink.write, chunk)  # a file's writes off the event loop


async def _open(js: JetStreamContext, bucket: str, artifact: ArtifactView) -> AsyncIterator[bytes]:
    try:
        store = await js.object_store(bucket)
        info = await store.get_info(artifact.object)
    except (ObjectNotFoundError, BucketNotFoundError, NotFoundError):
        raise NotFound(
            f"artifact {artifact.name!r} of attempt {artifact.attempt} is gone from the bucket (retention)",
            object=artifact.object,
        ) from None
    except nats.errors.Error as exc:
        raise NatsUnreachable(f"reading artifact {artifact.name!r} failed: {type(exc).__name__}: {exc}") from None
    return _chunks(JetStreamReader(js), bucket, info.nuid or "", artifact)


async def _chunks(reader: JetStreamReader, bucket: str, nuid: str, artifact: ArtifactView) -> AsyncIterator[bytes]:
    digest, size = hashlib.sha256(), 0
    if artifact.size > 0:
        # the object's chunks, as nats-py's object store names them
        async with await reader.open(f"OBJ_{bucket}", f"$O.{bucket}.C.{nuid}") as chunks:
            while size < artifact.size:
                msg = await chunks.next(CHUNK_WAIT_S)
                if msg is None:
                    raise Internal(f"artifact {artifact.name!r} stopped after {size} bytes")
                digest.update(msg.data)
                size += len(msg.data)
                if size > artifact.size:
                    break
                if size == artifact.size and digest.hexdigest() != artifact.sha256:
                    break  # the last chunk is not passed on: the bytes are wrong
                yield msg.data
                if msg.metadata.num_pending == 0:
                    break
    if size != artifact.size or digest.hexdigest() != artifact.sha256:
        raise Internal(f"artifact {artifact.name!r} read back as {size} bytes, sha256 {digest.hexdigest()}")


async def download(js: JetStreamContext, bucket: str, artifact: ArtifactView, path: Path, *, force: bool) -> Path:
    """Write the artifact to `path` atomically (a temporary file beside it, renamed once checked).

    Raises:
        FileExistsError: `path` exists and not `force`.
        NotFound, Internal, NatsUnreachable: as `read_into`.
    """
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists (use --force to replace it)")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as sink:
            await read_into(js, bucket, artifact, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return path
