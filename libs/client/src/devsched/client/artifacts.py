"""Reading a task's artifacts (issue 12): the listing from the scheduler, the bytes from the bucket.

The scheduler lists them (`P.api.tasks.artifacts`: name, size, SHA-256, step, and the object that holds
each). The bytes are read straight from the Object Store bucket `<PU>_ARTIFACTS` with the caller's own
NATS credentials (operators may read it; hosts may not), chunk by chunk into a file, and checked against
the SHA-256 the scheduler recorded before the file is put in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from devsched.client.errors import NatsUnreachable
from devsched.core.errors import Internal, NotFound
from devsched.protocol.artifacts import ArtifactView


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


async def read_into(js: JetStreamContext, bucket: str, artifact: ArtifactView, sink: BinaryIO) -> None:
    """Write the artifact's bytes into `sink`, checking its size and SHA-256 as recorded.

    Raises:
        NotFound: the object is gone (the bucket's max age removed it).
        Internal: the bytes are not what was stored.
        NatsUnreachable: NATS or the bucket cannot be read (permissions included).
    """
    try:
        store = await js.object_store(bucket)
        digest, size = hashlib.sha256(), 0

        class _Hashing:
            def write(self, data: bytes) -> int:
                nonlocal size
                digest.update(data)
                size += len(data)
                return sink.write(data)

        # nats-py writes each chunk from a worker thread, one after another
        await store.get(artifact.object, writeinto=_Hashing())  # type: ignore[arg-type]
    except (ObjectNotFoundError, BucketNotFoundError, NotFoundError):
        raise NotFound(
            f"artifact {artifact.name!r} of attempt {artifact.attempt} is gone from the bucket (retention)",
            object=artifact.object,
        ) from None
    except nats.errors.Error as exc:
        raise NatsUnreachable(f"reading artifact {artifact.name!r} failed: {type(exc).__name__}: {exc}") from None
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
