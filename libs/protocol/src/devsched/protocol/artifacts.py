"""Artifacts (an addition): files a step leaves in `DEVSCHED_ARTIFACTS_DIR`, stored for operators.

A host never writes to the artifacts bucket itself (an Object Store's chunk subjects cannot be confined to
one host). The agent publishes a file's bytes in chunks of at most `CHUNK_BYTES` on its own subject
`P.host.<host_id>.upload.<task_id>.<attempt>.<upload_id>` (stream `<PU>_UPLOADS`), each with the header
`Devsched-Chunk: <index>` (from 0) and `Nats-Msg-Id: <upload_id>.<index>`, then asks the scheduler to
commit them (`P.host.<host_id>.artifact`, `ArtifactCommit`). The scheduler checks the lease and the caps,
reads the chunks back from the committing host's subject, checks their size and SHA-256, and puts the file
into the bucket `<PU>_ARTIFACTS` as object `<task_id>/<attempt>/<upload_id>` (its description is the name).
"""

from __future__ import annotations

import re
import unicodedata

from pydantic import Field, field_validator

from devsched.protocol.base import Cursor, Id, ReplyModel, RequestModel, ShortName, Timestamp, Token

__all__ = [
    "ArtifactCommit",
    "ArtifactFailure",
    "ArtifactView",
    "ListArtifactsReply",
    "ListArtifactsRequest",
    "StepArtifacts",
]

KiB = 1024
MiB = 1024 * KiB
#: Bytes of file per chunk message: well under NATS's default `max_payload` (1 MiB).
CHUNK_BYTES = 128 * KiB
#: The header naming a chunk's place in its file, counted from 0.
CHUNK_HEADER = "Devsched-Chunk"
#: Longest artifact name (its path under the artifacts directory), in characters; each part at most 255.
MAX_NAME_CHARS = 1024
#: Longest artifact name in UTF-8 bytes: it is part of the artifacts' btree key, whose entries hold at most
#: 2704 bytes (1024 characters of up to 4 bytes each would not fit).
MAX_NAME_BYTES = 2048
_MAX_PART_CHARS = 255
#: Most failures a step's artifacts summary names (the counts cover them all).
MAX_FAILURES_LISTED = 20
#: Longest reason an artifact was not stored, in characters (longer ones are cut).
MAX_FAILURE_CHARS = 512
#: Default caps, the scheduler's (settings) and the agent's (agent.toml) alike.
DEFAULT_MAX_FILE_BYTES = 256 * MiB
DEFAULT_MAX_ATTEMPT_BYTES = 1024 * MiB
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def normalise_name(name: str) -> str:
    """`name` as an artifact name: a relative POSIX path, without empty, `.` or `..` parts.

    Redundant slashes and `.` parts are dropped (`./a//b` is `a/b`); what cannot be made one is refused.

    Raises:
        ValueError: absolute, empty, climbing out (`..`), too long, or with control characters.
    """
    if not name or name.startswith("/"):
        raise ValueError(f"artifact name {name!r} must be a relative path")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in name):
        raise ValueError(f"artifact name {name!r} holds control characters")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise ValueError(f"artifact name {name!r} names no file")
    if ".." in parts:
        raise ValueError(f"artifact name {name!r} climbs out of the artifacts directory")
    if any(len(p) > _MAX_PART_CHARS for p in parts):
        raise ValueError(f"artifact name {name!r} has a part longer than {_MAX_PART_CHARS} characters")
    normal = "/".join(parts)
    if len(normal) > MAX_NAME_CHARS:
        raise ValueError(f"artifact name is longer than {MAX_NAME_CHARS} characters")
    if len(normal.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ValueError(f"artifact name is longer than {MAX_NAME_BYTES} bytes of UTF-8")
    return normal


def chunk_count(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many chunks carry a file of `size` bytes (none for an empty file)."""
    return -(-size // chunk_bytes)


def object_name(task_id: object, attempt: int, upload_id: str) -> str:
    """`<task_id>/<attempt>/<upload_id>`: the object of one stored upload in the artifacts bucket."""
    return f"{task_id}/{attempt}/{upload_id}"


def upload_msg_id(upload_id: str, index: int) -> str:
    """`Nats-Msg-Id` of a chunk: `<upload_id>.<index>`, so a publish retried after a lost ack is stored once."""
    return f"{upload_id}.{index}"


class ArtifactCommit(RequestModel):
    """`P.host.<host_id>.artifact`: store the file whose chunks the host published under `upload_id`."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt, from the assignment."""
    lease_id: Id
    """The attempt's lease id, from the assignment."""
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    """The file's path under the artifacts directory, normalised (`normalise_name`)."""
    step: ShortName
    """The step after which the file was found (new, or changed since)."""
    size: int = Field(ge=0)
    """The file's size in bytes."""
    sha256: str
    """The file's SHA-256, 64 lower-case hex digits."""
    chunks: int = Field(ge=0)
    """How many chunks carry it (`chunk_count(size)`)."""
    upload_id: Token
    """The last token of the chunks' subject: fresh for every upload."""

    @field_validator("name")
    @classmethod
    def _normal(cls, name: str) -> str:
        if normalise_name(name) != name:
            raise ValueError("the name must be normalised (a relative path without '', '.' or '..' parts)")
        return name

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.fullmatch(value):
            raise ValueError("sha256 must be 64 lower-case hex digits")
        return value


class ArtifactView(ReplyModel):
    """One stored artifact."""

    attempt: int
    """The attempt that left it."""
    name: str
    """Its path under the attempt's artifacts directory."""
    step: str
    """The step after which it was stored (the last one that changed it)."""
    size: int
    """Its size in bytes."""
    sha256: str
    """Its SHA-256, hex."""
    host_id: str
    """The host that uploaded it."""
    stored_at: Timestamp
    """When it was stored."""
    object: str
    """Its object in the bucket `<PU>_ARTIFACTS` (`<task_id>/<attempt>/<upload_id>`)."""


class ListArtifactsRequest(RequestModel):
    """`P.api.tasks.artifacts`: the artifacts of a task, optionally of one attempt."""

    task_id: Id
    """The task."""
    attempt: int | None = Field(default=None, ge=1)
    """Only this attempt's; all attempts' when null."""
    after: Cursor | None = Field(default=None, exclude_if=lambda v: v is None)
    """Addition: the `next` of the previous reply (opaque): only the artifacts after it; left out when null."""


class ListArtifactsReply(ReplyModel):
    """The artifacts of a task, by attempt then name."""

    task_id: Id
    """The task."""
    bucket: str
    """The Object Store bucket that holds them."""
    artifacts: list[ArtifactView] = Field(default_factory=list)
    """By attempt, then name (up to `next`)."""
    next: str | None = None
    """Addition: set when the artifacts left would make the reply larger than NATS's `max_payload`: pass it
    as `after` for the rest; null when every one is listed."""


class ArtifactFailure(RequestModel):
    """An artifact the agent could not store, and why."""

    name: str = Field(max_length=MAX_NAME_CHARS)
    """The file (as found; it may be a name that was refused)."""
    error: str = Field(max_length=MAX_FAILURE_CHARS)
    """Why: over a cap, unreadable, refused by the scheduler, NATS away, ..."""


class StepArtifacts(RequestModel):
    """What happened to the files a step left in the artifacts directory (part of its result)."""

    stored: int = Field(default=0, ge=0)
    """Files stored after this step (new or changed)."""
    stored_bytes: int = Field(default=0, ge=0)
    """Their bytes."""
    failed: int = Field(default=0, ge=0)
    """Files not stored."""
    failures: list[ArtifactFailure] = Field(default_factory=list, max_length=MAX_FAILURES_LISTED)
    """The first of them, with why."""


def cut(text: str, limit: int = MAX_FAILURE_CHARS) -> str:
    """`text` cut to `limit` characters (an ellipsis marks a cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
