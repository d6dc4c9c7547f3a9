"""Artifacts out (issue 12): after each step, the files of `DEVSCHED_ARTIFACTS_DIR` that are new or changed.

The directory is the step's, so what is in it is untrusted (the agent may be root): the walk follows no
symbolic link, and each file is opened beneath the directory one part at a time without following links,
checked on its descriptor (a regular file with one link, owned by the step user when there is one:
`results.open_beneath`). A link, a FIFO or a device is listed as not stored, with why.

Each file's bytes go in chunks of `CHUNK_BYTES` to the host's own subject
`P.host.<host_id>.upload.<task_id>.<attempt>.<upload_id>` (stream `<PU>_UPLOADS`, a window of chunks in
flight), hashed as they are read; then the scheduler is asked to commit them (`P.host.<host_id>.artifact`),
which checks them against the size and SHA-256 sent and stores the file (`devsched.scheduler.artifacts`).
A file is sent again when its size, modification time or inode changed since it was stored.

Caps are checked here first (`artifact_max_file_bytes`, `artifact_max_attempt_bytes`: the scheduler checks
its own again). Nothing here changes how a step ends: what was not stored, and why, is the step result's
`artifacts`. After a stop (cancellation, shutdown) uploading is bounded by the stop grace; after a lease
loss nothing is sent (the scheduler would refuse it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext

from devsched.agent.results import ResultsError, open_beneath
from devsched.agent.steps import StepUser
from devsched.agent.stop import StopSignal
from devsched.core.errors import TooManyRequests
from devsched.core.text import storable
from devsched.protocol import messages as m
from devsched.protocol.artifacts import (
    CHUNK_BYTES,
    CHUNK_HEADER,
    DEFAULT_MAX_ATTEMPT_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    MAX_FAILURES_LISTED,
    chunk_count,
    cut,
    normalise_name,
    upload_msg_id,
)
from devsched.protocol.endpoints import HOST_ARTIFACT
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects
from devsched.protocol.transport import request

logger = logging.getLogger(__name__)

#: Chunks published and not yet acknowledged, at most.
WINDOW = 16
#: Time per MiB a commit may take on top of the request timeout (the scheduler copies the chunks).
_COMMIT_S_PER_MIB = 0.25
#: Tries of a commit the scheduler answers 429 (its commit slots busy), and the longest pause between them.
_COMMIT_TRIES = 30
_COMMIT_MAX_PAUSE_S = 5.0


@dataclass(frozen=True, slots=True)
class UploadLimits:
    """The agent's caps (agent.toml `artifact_*`)."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_attempt_bytes: int = DEFAULT_MAX_ATTEMPT_BYTES


@dataclass(frozen=True, slots=True)
class Found:
    """A file of the artifacts directory (or what stands where a file should be)."""

    name: str
    #: (size, mtime_ns, inode) from lstat: what tells a changed file.
    stamp: tuple[int, int, int]
    #: Why it cannot be stored, when it cannot (a link, not a regular file, a bad name).
    refused: str | None = None


def scan(directory: Path) -> list[Found]:
    """Every entry of `directory` that is not a directory, recursively, without following links (blocking)."""
    found: list[Found] = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        relative_root = os.path.relpath(root, directory)
        for entry in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
            raw = entry if relative_root == "." else f"{relative_root}/{entry}"
            try:
                name = normalise_name(raw)
            except ValueError as exc:
                found.append(Found(raw, (0, 0, 0), str(exc)))
                continue
            try:
                st = os.lstat(os.path.join(root, entry))
            except OSError:
                continue  # gone meanwhile
            stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
            refused = None
            if stat.S_ISLNK(st.st_mode):
                refused = "a symbolic link: only regular files are stored"
            elif not stat.S_ISREG(st.st_mode):
                refused = "not a regular file"
            found.append(Found(name, stamp, refused))
        dirs.sort()
    return found


def is_empty(directory: Path) -> bool:
    """Whether `directory` holds no entry (False when it cannot be read: the walk then says why).

    One `getdents` of a directory the agent made and the step may have filled, cheap enough for the event
    loop; what the walk would find is then nothing, so neither it nor its thread is needed.
    """
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is None
    except OSError:
        return False


@dataclass(slots=True)
class _Summary:
    stored: int = 0
    stored_bytes: int = 0
    failures: list[m.ArtifactFailure] = field(default_factory=list)
    failed: int = 0

    def fail(self, name: str, why: str) -> None:
        self.failed += 1
        if len(self.failures) < MAX_FAILURES_LISTED:
            self.failures.append(m.ArtifactFailure(name=cut(storable(name), 1024), error=cut(storable(why))))
        logger.warning("artifact not stored", extra={"artifact": name, "error": why})

    def result(self) -> m.StepArtifacts | None:
        if not self.stored and not self.failed:
            return None
        return m.StepArtifacts(
            stored=self.stored, stored_bytes=self.stored_bytes, failed=self.failed, failures=self.failures
        )


class AttemptUploads:
    """One attempt's artifacts: what was stored so far, and the upload after each step."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        host_id: str,
        assignment: m.Assignment,
        directory: Path,
        *,
        limits: UploadLimits,
        user: StepUser | None,
        stop: StopSignal,
        stop_grace_s: float,
        timeout_s: float,
    ) -> None:
        self._nc = nc
        #: Made at the first upload: most attempts store nothing.
        self._js: JetStreamContext | None = None
        self._subjects = subjects
        self._host_id = host_id
        self._a = assignment
        self._directory = directory
        self._limits = limits
        self._owner = None if user is None else user.uid
        self._stop = stop
        self._stop_grace_s = stop_grace_s
        self._timeout_s = timeout_s
        #: Stamps of the files stored, by name; and what refused files looked like (not tried again unchanged).
        self._stored: dict[str, tuple[int, int, int]] = {}
        self._sizes: dict[str, int] = {}
        self._refused: dict[str, tuple[int, int, int]] = {}

    @property
    def stored_bytes(self) -> int:
        """Bytes of the attempt's artifacts stored so far (a replaced file counts once)."""
        return sum(self._sizes.values())

    async def after_step(self, step: str) -> m.StepArtifacts | None:
        """Store what the step left that is new or changed; what was stored and what not (None: nothing new)."""
        summary = _Summary()
        if self._stop.halted:
            return None  # the lease is lost, or the grace is over: the scheduler would refuse
        try:
            if self._stop.stopped:
                async with asyncio.timeout(self._stop_grace_s):
                    await self._upload_changed(step, summary)
            else:
                await self._upload_changed(step, summary)
        except TimeoutError:
            summary.fail("*", f"uploading stopped: the stop grace ({self._stop_grace_s:g} s) is over")
        except Exception as exc:  # never the step's outcome
            logger.exception("artifact upload failed")
            summary.fail("*", f"uploading failed: {type(exc).__name__}")
        return summary.result()

    async def _upload_changed(self, step: str, summary: _Summary) -> None:
        if is_empty(self._directory):
            return  # most steps leave nothing: one directory read here instead of a walk in a thread
        try:
            found = await asyncio.to_thread(scan, self._directory)
        except OSError as exc:
            summary.fail(".", f"the artifacts directory cannot be read: {os.strerror(exc.errno or 0)}")
            return
        for item in found:
            if self._stored.get(item.name) == item.stamp or self._refused.get(item.name) == item.stamp:
                continue
            why = item.refused or self._over_cap(item)
            if why is None:
                why = await self._upload(step, item, summary)
            if why is not None:
                self._refused[item.name] = item.stamp
                summary.fail(item.name, why)

    def _over_cap(self, item: Found) -> str | None:
        size = item.stamp[0]
        if size > self._limits.max_file_bytes:
            return f"{size} bytes, above the per-file cap of {self._limits.max_file_bytes} bytes"
        total = self.stored_bytes - self._sizes.get(item.name, 0) + size
        if total > self._limits.max_attempt_bytes:
            return (
                f"the attempt's artifacts would total {total} bytes, above the per-attempt cap of "
                f"{self._limits.max_attempt_bytes} bytes"
            )
        return None

    async def _upload(self, step: str, item: Found, summary: _Summary) -> str | None:
        """Send one file and commit it; why it was not stored, or None."""
        try:
            fd = await asyncio.to_thread(open_beneath, self._directory, item.name, owner=self._owner, max_bytes=None)
        except ResultsError as exc:
            return str(exc)
        started = time.perf_counter()
        try:
            size, sha256, upload_id, st = await self._send(fd, item)
        except Exception as exc:
            return f"the chunks could not be published: {type(exc).__name__}: {exc}"
        finally:
            os.close(fd)
        if size > self._limits.max_file_bytes:
            return f"grew to {size} bytes while it was read, above the per-file cap"
        a = self._a
        commit = m.ArtifactCommit(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            name=item.name,
            step=step,
            size=size,
            sha256=sha256,
            chunks=chunk_count(size),
            upload_id=upload_id,
        )
        timeout = self._timeout_s + _COMMIT_S_PER_MIB * size / (1024 * 1024)
        for tries_left in range(_COMMIT_TRIES - 1, -1, -1):
            try:
                await request(
                    self._nc,
                    self._subjects.endpoint(HOST_ARTIFACT, self._host_id),
                    commit,
                    HOST_ARTIFACT.reply,
                    timeout=timeout,
                )
            except TooManyRequests as exc:  # the scheduler's commit slots are busy: the chunks wait in the stream
                if tries_left:
                    await asyncio.sleep(min(_COMMIT_MAX_PAUSE_S, float(exc.details.get("retry_after_s") or 1.0)))
                    continue
                return f"refused by the scheduler ({exc.code}): {exc}"
            except Exception as exc:
                code = getattr(exc, "code", type(exc).__name__)
                return f"refused by the scheduler ({code}): {exc}"
            break
        self._stored[item.name] = st
        self._sizes[item.name] = size
        summary.stored += 1
        summary.stored_bytes += size
        logger.info(
            "artifact stored",
            extra={"artifact": item.name, "size": size, "ms": round((time.perf_counter() - started) * 1000, 1)},
        )
        return None

    async def _send(self, fd: int, item: Found) -> tuple[int, str, str, tuple[int, int, int]]:
        """Publish the file behind `fd` in chunks; its size, SHA-256, upload id and stamp."""
        a = self._a
        upload_id = secrets.token_hex(12)
        subject = self._subjects.host_upload(self._host_id, a.task_id, a.attempt, upload_id)
        digest = hashlib.sha256()
        st = os.fstat(fd)
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        pending: list[asyncio.Future[object]] = []
        size, index = 0, 0
        try:
            while chunk := await asyncio.to_thread(_read_chunk, fd):
                digest.update(chunk)
                size += len(chunk)
                if size > self._limits.max_file_bytes:
                    break
                headers = {CHUNK_HEADER: str(index), MSG_ID_HEADER: upload_msg_id(upload_id, index)}
                if self._js is None:
                    self._js = self._nc.jetstream()
                publish: Awaitable[object] = self._js.publish(subject, chunk, timeout=self._timeout_s, headers=headers)
                pending.append(asyncio.ensure_future(publish))
                if len(pending) >= WINDOW:
                    await pending.pop(0)
                index += 1
            for ack in pending:
                await ack
            pending.clear()
        finally:
            for ack in pending:
                ack.cancel()
            for ack in pending:
                with contextlib.suppress(BaseException):
                    await ack
        return size, digest.hexdigest(), upload_id, stamp


def _read_chunk(fd: int) -> bytes:
    """Up to `CHUNK_BYTES` of the file, fewer only at its end."""
    parts, got = [], 0
    while got < CHUNK_BYTES:
        part = os.read(fd, CHUNK_BYTES - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


#: Makes an attempt's uploads: (assignment, artifacts directory, step user, stop signal).
UploadsFactory = Callable[[m.Assignment, Path, "StepUser | None", StopSignal], AttemptUploads]


def uploads_factory(
    nc: Client, subjects: Subjects, host_id: str, *, limits: UploadLimits, stop_grace_s: float, timeout_s: float
) -> UploadsFactory:
    """The factory the agent hands its attempts."""

    def make(assignment: m.Assignment, directory: Path, user: StepUser | None, stop: StopSignal) -> AttemptUploads:
        return AttemptUploads(
            nc,
            subjects,
            host_id,
            assignment,
            directory,
            limits=limits,
            user=user,
            stop=stop,
            stop_grace_s=stop_grace_s,
            timeout_s=timeout_s,
        )

    return make
