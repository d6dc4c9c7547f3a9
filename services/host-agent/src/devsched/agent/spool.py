"""The report spool: terminal reports (and releases) on disk from before they are sent until answered.

A release (the attempt given back rather than reported, `P.host.<host_id>.release`) is spooled the same
way, under its attempt's report key with the suffix `.release`: an attempt ends with one or the other.

A report is written atomically (a temporary file, fsync, rename, fsync of the directory) so that after a
crash the spool holds either the whole report or nothing of it. An agent that starts with reports in its
spool resends them, byte for byte, before it takes new work. A report is removed once the scheduler has
answered it (recorded, duplicate, or a 409 that makes it moot). A report the scheduler can never accept
(it fails the schema, or is too large) is moved to `rejected/` for an operator: never lost silently.

Beside the reports, the spool keeps small records of what the agent must know after a crash, each kind in a
directory of its own (`Spool.records`): the attempts it holds, the attempts it took (`taken.py`) and the
process groups of its steps.

The spool is the agent's alone: the directory is 0700 and its files 0600, owned by the agent's user (a
step, which may run as another user, must not read the reports of other tasks). `lock` tightens a
spool left looser by an older agent and refuses one owned by another user.

The methods do blocking file I/O on small files; call them from a thread in async code.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}$")
#: The name of a kind of records: no dot, so it is never a report's file name.
_KIND = re.compile(r"^[a-z][a-z_-]{0,39}$")
_SUFFIX = ".json"
_TMP_SUFFIX = ".tmp"
REJECTED = "rejected"
LOCK_FILE = ".lock"
#: The end of a release's spool key (a report's key never ends so: it ends with the attempt number).
RELEASE_SUFFIX = ".release"


@dataclass(frozen=True, slots=True)
class SpooledReport:
    """One pending report, or release."""

    key: str
    body: bytes
    #: Where it is stored; None for a report that could not be spooled (sent from memory only).
    path: Path | None

    @property
    def is_release(self) -> bool:
        """Whether it gives the attempt back (`release`) rather than reporting how it ended."""
        return self.key.endswith(RELEASE_SUFFIX)

    @property
    def attempt_key(self) -> str:
        """The report key of its attempt (for a report, its own key)."""
        return self.key.removesuffix(RELEASE_SUFFIX)


def report_key(task_id: str, attempt: int) -> str:
    """The spool key of a task attempt's report (one report per attempt)."""
    return f"{task_id}.{attempt}"


def release_key(task_id: str, attempt: int) -> str:
    """The spool key of a task attempt's release (an attempt is either reported or released)."""
    return report_key(task_id, attempt) + RELEASE_SUFFIX


def _key_path(directory: Path, key: str) -> Path:
    if not _KEY.fullmatch(key):
        raise ValueError(f"invalid spool key {key!r}")
    return directory / f"{key}{_SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, body: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            view = memoryview(body)
            while view:  # no buffered file object: the body is written whole, then synced
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


class SpoolLocked(Exception):
    """Another process (another agent) holds the spool."""


class SpoolUnsafe(Exception):
    """The spool directory is not the agent's own (another user owns it, or it is not a directory)."""


def _tighten(path: Path, mode: int) -> None:
    """Make `path` (not followed if a symlink) no more open than `mode`."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


class Spool:
    """A directory of pending reports, one file per key.

    One agent owns a spool: `lock` takes an exclusive lock for the life of the process (two agents
    sharing one spool would resend each other's reports and delete each other's half-written files).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Take the spool for this process, and clear what a crash in the middle of `put` left.

        Raises:
            SpoolLocked: another process holds it.
            SpoolUnsafe: it is not a directory owned by this process's user.
        """
        self._secure()
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolLocked(f"spool {self.directory} is in use by another process") from None
        self._lock_fd = fd
        # A temporary file is what a crash in the middle of `put` leaves: its report was never sent.
        for leftover in [*self.directory.glob(f".*{_TMP_SUFFIX}"), *self.directory.glob(f"*/.*{_TMP_SUFFIX}")]:
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    def _secure(self) -> None:
        st = os.lstat(self.directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise SpoolUnsafe(f"spool {self.directory} is not a directory owned by the agent's user ({os.geteuid()})")
        _tighten(self.directory, 0o700)
        for path in self.directory.iterdir():
            _tighten(path, 0o700 if path.is_dir() else 0o600)
            if path.is_dir() and not path.is_symlink():  # rejected/ and the records' directories
                for inner in path.iterdir():
                    _tighten(inner, 0o600)

    def unlock(self) -> None:
        """Release the lock taken by `lock`."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _path(self, key: str) -> Path:
        return _key_path(self.directory, key)

    def records(self, kind: str) -> Records:
        """The records of `kind` (a directory of the spool: not `rejected`, nor a report's key)."""
        if kind == REJECTED or not _KIND.fullmatch(kind):
            raise ValueError(f"invalid kind of spool records {kind!r}")
        return Records(self.directory / kind)

    def put(self, key: str, body: bytes) -> Path:
        """Store `body` under `key` durably (replacing an older body with the same key)."""
        path = self._path(key)
        _write_atomically(path, body)
        return path

    def get(self, key: str) -> bytes | None:
        """The body stored under `key`, if any."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def pending(self) -> list[SpooledReport]:
        """Every stored report, oldest first."""
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                found.append((path.stat().st_mtime_ns, path.name, path.read_bytes(), path))
            except FileNotFoundError:  # removed meanwhile
                continue
        found.sort(key=lambda item: (item[0], item[1]))
        return [SpooledReport(path.name[: -len(_SUFFIX)], body, path) for _, _, body, path in found]

    def depth(self) -> int:
        """How many reports are stored (for the metrics: names only, no file read)."""
        return sum(1 for path in self.directory.glob(f"*{_SUFFIX}") if not path.name.startswith("."))

    def remove(self, key: str) -> None:
        """Forget the report under `key` (no error if it is gone already)."""
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(self.directory)

    def remove_all(self, keys: Iterable[str]) -> None:
        """Forget the reports under `keys`, with one sync of the directory for them all (if one was there)."""
        removed = False
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()
                removed = True
        if removed:
            _fsync_dir(self.directory)

    def reject(self, key: str, why: str) -> Path | None:
        """Move the report under `key` to `rejected/`, with `why` beside it; None if it was gone."""
        source = self._path(key)
        target_dir = self.directory / REJECTED
        target_dir.mkdir(mode=0o700, exist_ok=True)
        target = target_dir / source.name
        try:
            os.replace(source, target)
        except FileNotFoundError:
            return None
        _write_atomically(target_dir / f"{key}.reason.txt", why.encode("utf-8"))
        _fsync_dir(self.directory)
        return target


class Records:
    """Small records in a directory of the spool, one file per key, each written whole or not at all."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, exist_ok=True)

    def put(self, key: str, body: bytes) -> Path:
        """Store `body` under `key` durably (replacing an older body with the same key)."""
        path = _key_path(self.directory, key)
        _write_atomically(path, body)
        return path

    def remove(self, key: str) -> None:
        """Forget the record under `key` (no error if it is gone already)."""
        try:
            _key_path(self.directory, key).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(self.directory)

    def remove_all(self, keys: Iterable[str]) -> None:
        """Forget the records under `keys`, with one sync of the directory at the end."""
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                _key_path(self.directory, key).unlink()
        _fsync_dir(self.directory)

    def move(self, key: str, other: Records) -> None:
        """Move the record under `key` to `other`, keeping its body and time (no error if it is gone)."""
        source = _key_path(self.directory, key)
        try:
            os.replace(source, _key_path(other.directory, key))
        except FileNotFoundError:
            return
        _fsync_dir(other.directory)
        _fsync_dir(self.directory)

    def keys_by_age(self) -> list[str]:
        """Every record's key, oldest first (by the time its body was written)."""
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                found.append((path.stat().st_mtime_ns, path.name[: -len(_SUFFIX)]))
            except FileNotFoundError:  # removed meanwhile
                continue
        return [key for _, key in sorted(found)]

    def items(self) -> list[tuple[str, bytes]]:
        """Every record as `(key, body)`, by key."""
        found = []
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                found.append((path.name[: -len(_SUFFIX)], path.read_bytes()))
            except FileNotFoundError:  # removed meanwhile
                continue
        return found
