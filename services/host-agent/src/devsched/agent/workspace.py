"""Where steps run and as whom: per-attempt directories, the step user, and the checks made at start.

Each attempt gets its own directory `<work_dir>/<host_id>-<spool key>/<task_id>.<attempt>` (mode 0700,
owned by the step user when there is one): the steps' `TMPDIR` and default `cwd`. In it, `artifacts/`
(`DEVSCHED_ARTIFACTS_DIR`, same mode and owner) is where steps leave files for the agent to read, such as
test results (`results.py`). Both are created empty before the first step and removed once the attempt has
ended, however it ended; what a crashed agent left behind is removed at the next start. The host's
directory is named after the spool too (`workspace_name`): the spool is what makes an agent the same agent
across restarts (one process at a time holds it), so two agents that share a host id but not a spool (two
`devsched up` stacks, two test runs) never share, lock or clear each other's directory; a lock in it guards
the rest.

With `step_user`, steps run as that user and its primary group only. The agent refuses to start unless
it has the capabilities to switch to it and clean up after it (`_NEEDED_CAPS`: root has them unless a
container dropped them), unless the user is unprivileged and not the agent's own, and unless a
credentials file of the agent is closed to group and others. The step user must be able to reach its
directory, so the host's directory is 0711 (it can pass, not list) and every parent must let it pass.

The functions do blocking file I/O on small directories; call them from a thread in async code.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import re
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from devsched.agent.config import AgentConfig, ConfigError
from devsched.agent.steps import StepUser
from devsched.protocol.tls import NatsSettings

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
#: The artifacts directory's name inside an attempt's directory.
ARTIFACTS = "artifacts"
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}$")
#: Capability numbers (linux/capability.h) the agent needs with a step user: switch to it (SETUID, SETGID),
#: stop its process groups (KILL), hand it the attempt's directory (CHOWN) and remove what it left there
#: (DAC_OVERRIDE: the directory is the step user's, mode 0700).
CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL, CAP_SETGID, CAP_SETUID = 0, 1, 5, 6, 7
_NEEDED_CAPS = {
    CAP_CHOWN: "CAP_CHOWN",
    CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE",
    CAP_KILL: "CAP_KILL",
    CAP_SETGID: "CAP_SETGID",
    CAP_SETUID: "CAP_SETUID",
}
#: Fields of AgentConfig naming files that hold secrets: closed to group and others when steps run as a user.
SECRET_FILE_FIELDS = NatsSettings.secret_files()


def artifacts_dir(attempt_dir: Path) -> Path:
    """The artifacts directory of the attempt whose directory is `attempt_dir` (`Workspace.create` makes it)."""
    return attempt_dir / ARTIFACTS


def workspace_name(host_id: str, spool_dir: Path) -> str:
    """The name of the host's directory under `work_dir`: the host id and a digest of the spool's path."""
    digest = hashlib.sha256(os.path.abspath(spool_dir).encode()).hexdigest()[:12]
    return f"{host_id}-{digest}"


class WorkspaceLocked(Exception):
    """Another process (another agent of this host) holds the work directory."""


def effective_capabilities(status: str | None = None) -> int | None:
    """The `CapEff` mask of this process (from /proc/self/status), None where there is no /proc."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return None


def missing_capabilities(mask: int | None, euid: int) -> list[str]:
    """Names of the capabilities of `_NEEDED_CAPS` not in `mask` (without a mask: all unless root)."""
    if mask is None:
        return [] if euid == 0 else sorted(_NEEDED_CAPS.values())
    return [name for bit, name in sorted(_NEEDED_CAPS.items()) if not mask & (1 << bit)]


def resolve_step_user(name: str, *, euid: int | None = None, capabilities: int | None = -1) -> StepUser:
    """Look `name` up and check the agent can run steps as it.

    Args:
        name: the `step_user` of agent.toml.
        euid: the agent's effective uid (this process's by default).
        capabilities: the agent's `CapEff` mask (this process's by default; None: unknown).

    Raises:
        ConfigError: the user does not exist, is privileged or the agent's own, or the agent cannot switch.
    """
    euid = os.geteuid() if euid is None else euid
    mask = effective_capabilities() if capabilities == -1 else capabilities
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"step_user {name!r}: no such user on this host") from None
    if entry.pw_uid == 0:
        raise ConfigError(f"step_user {name!r} is root: steps must run as an unprivileged user")
    if entry.pw_uid == euid:
        raise ConfigError(f"step_user {name!r} is the agent's own user: its steps could read the agent's credentials")
    missing = missing_capabilities(mask, euid)
    if missing:
        raise ConfigError(
            f"step_user {name!r}: the agent cannot run steps as another user without "
            f"{', '.join(missing)} (run it as root, or grant those capabilities)"
        )
    home = entry.pw_dir if entry.pw_dir and os.path.isdir(entry.pw_dir) else None
    return StepUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=home)


def can_pass(st: os.stat_result, user: StepUser) -> bool:
    """Whether `user` (its primary group only) may search a directory with this stat."""
    if st.st_uid == user.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == user.gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def open_to_others(st: os.stat_result) -> bool:
    """Whether group or others have any permission on the file."""
    return bool(st.st_mode & 0o077)


def check_secret_files(config: AgentConfig, user: StepUser | None) -> list[str]:
    """Check the files of `SECRET_FILE_FIELDS`; the warnings to log.

    With a step user, a secret the step user could read (its own, or open to group or others) is fatal:
    that is exactly what `step_user` is there to prevent. Without one, steps run as the agent and can
    read it anyway, so a loose mode is a warning (other local users can read it).

    Raises:
        ConfigError: a secret file is readable by the step user.
    """
    warnings = []
    for field in SECRET_FILE_FIELDS:
        path = getattr(config, field, None)
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue  # connecting reports a missing file, with the connection's own error
        loose = open_to_others(st)
        # The step user runs with its primary group only: a file the agent's group may read (a Secret
        # mounted with fsGroup) is closed to it unless that group is the step user's.
        reachable = bool(st.st_mode & 0o007) or (bool(st.st_mode & 0o070) and st.st_gid == user.gid) if user else False
        if user is not None and (reachable or st.st_uid == user.uid):
            raise ConfigError(
                f"{field} {path} is readable by step_user {user.name!r} (mode {stat.S_IMODE(st.st_mode):04o}, "
                f"uid {st.st_uid}): make it owned by the agent with mode 0600 or 0400"
            )
        if loose:
            warnings.append(
                f"{field} {path} has mode {stat.S_IMODE(st.st_mode):04o}: group and others can read the "
                "agent's credentials; make it 0600 or 0400"
            )
    return warnings


def _remove(path: Path) -> None:
    # rmtree works by file descriptor on Linux: a step that leaves a symlink behind cannot make the agent
    # delete what the link points to.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        path.unlink()


class Workspace:
    """This agent's corner of `work_dir`: one directory per running attempt."""

    def __init__(self, root: Path, name: str, user: StepUser | None = None) -> None:
        self.root = Path(root)
        #: The host's directory (`workspace_name`), holding the attempts' directories and the lock.
        self.directory = self.root / name
        self.user = user
        self._lock_fd: int | None = None

    def _prepare_root(self) -> None:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"work_dir {self.root} is not a directory")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"work_dir {self.root} is writable by others without the sticky bit (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): another user could replace the agent's directories"
            )

    def _prepare_host_dir(self) -> None:
        mode = 0o711 if self.user is not None else 0o700
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.directory, mode)
        st = os.lstat(self.directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError(f"work directory {self.directory} is not a directory owned by the agent's user")
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(self.directory, mode)

    def _check_reachable(self) -> None:
        if self.user is None:
            return
        for directory in (self.directory, *self.directory.parents):
            st = os.stat(directory)
            if st.st_uid == self.user.uid:
                raise ConfigError(
                    f"work_dir {self.root}: {directory} belongs to step_user {self.user.name!r}, which could "
                    "replace the agent's directories in it"
                )
            if not can_pass(st, self.user):
                raise ConfigError(
                    f"work_dir {self.root}: step_user {self.user.name!r} cannot pass through {directory}; "
                    "choose a work_dir whose parents others may search (mode o+x)"
                )

    def open(self) -> list[str]:
        """Create and lock the host's directory, and remove what an earlier agent left; the names removed.

        Raises:
            ConfigError: the directory is unsafe or unusable for the step user.
            WorkspaceLocked: another agent of this host holds it.
            OSError: it cannot be created.
        """
        self._prepare_root()
        self._prepare_host_dir()
        self._check_reachable()
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WorkspaceLocked(f"work directory {self.directory} is in use by another process") from None
        self._lock_fd = fd
        removed = []
        for entry in sorted(self.directory.iterdir()):
            if entry.name != LOCK_FILE:
                _remove(entry)
                removed.append(entry.name)
        return removed

    def close(self) -> None:
        """Release the lock taken by `open`."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def attempt_dir(self, task_id: str, attempt: int) -> Path:
        """Where the directory of this attempt is."""
        name = f"{task_id}.{attempt}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid attempt directory name {name!r}")
        return self.directory / name

    def create(self, task_id: str, attempt: int) -> Path:
        """Create the attempt's directory and its `artifacts/`, empty, mode 0700, owned by the step user (if any)."""
        path = self.attempt_dir(task_id, attempt)
        _remove(path)  # a duplicate of this attempt that ran before on this host
        os.mkdir(path, 0o700)
        try:
            # The artifacts directory first, while the attempt's directory is still the agent's alone.
            os.mkdir(artifacts_dir(path), 0o700)
            for directory in (artifacts_dir(path), path):
                os.chmod(directory, 0o700)  # whatever the umask
                if self.user is not None:
                    os.chown(directory, self.user.uid, self.user.gid)
        except BaseException:
            _remove(path)
            raise
        return path

    def remove(self, path: Path) -> bool:
        """Remove an attempt's directory and all it holds (no error if it is gone); whether it is gone."""
        _remove(path)
        return not os.path.lexists(path)

    def leftovers(self) -> Iterable[Path]:
        """What is in the host's directory besides the lock (for tests and operators)."""
        return sorted(p for p in self.directory.iterdir() if p.name != LOCK_FILE)
