"""The dashboard's operator token of `devsched up`, kept across runs in the user's state directory.

`$XDG_STATE_HOME/devsched/web-token` (else `~/.local/state/devsched/web-token`): the directory mode 0700, the
file 0600, both the user's own. A bookmark, a logged-in browser and a login link keep working from one `up`
to the next; `--rotate-web-token` makes a new one (which ends every session of the old one).

A token that others could read (group or other bits on the file) is replaced by a new one, and `up` says so.
A directory or file that others could write to, or that is not the user's, is refused: someone else could
have planted a token they know. The token is written through a new file renamed into place, so a reader
never sees half of one.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

#: The token file's name in the state directory.
TOKEN_FILE = "web-token"
_MIN_CHARS = 16


class TokenStoreError(Exception):
    """The state directory or token file cannot be trusted; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class KeptToken:
    """The token `up` uses, where it is kept, and why it is new (None: the kept one, reused)."""

    token: str
    path: Path
    new_because: str | None
    #: What was changed on the directory's mode, if anything.
    tightened: str | None = None


def state_dir(env: dict[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/devsched`, or `~/.local/state/devsched` (a relative XDG_STATE_HOME is ignored)."""
    environ = os.environ if env is None else env
    base = environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return root / "devsched"


def _private_dir(path: Path) -> str | None:
    """Refuse a directory others could write to or that is not the user's; close one others could read."""
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise TokenStoreError(f"{path} is not a directory: remove it, and `devsched up` makes it (mode 0700)")
    if info.st_uid != os.getuid():
        raise TokenStoreError(f"{path} belongs to another user (uid {info.st_uid}): the token is not kept there")
    if info.st_mode & 0o022:
        raise TokenStoreError(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): someone could have planted "
            f"a token there; check it, then `chmod 700 {path}`"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
        return f"{path} was open to others (mode {stat.S_IMODE(info.st_mode):04o}): now 0700"
    return None


def _read(path: Path) -> tuple[str | None, str | None]:
    """The kept token (None: none usable) and why it is not used, if there is one."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None, "there was none"
    if not stat.S_ISREG(info.st_mode):
        raise TokenStoreError(f"{path} is not a regular file: remove it, and `devsched up` writes a new token")
    if info.st_uid != os.getuid():
        raise TokenStoreError(f"{path} belongs to another user (uid {info.st_uid}): remove it")
    if info.st_mode & 0o022:
        raise TokenStoreError(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): someone could have set a "
            "token they know; remove it, and `devsched up` writes a new one"
        )
    if info.st_mode & 0o044:
        return None, f"the kept one was readable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    token = path.read_text().strip()
    if len(token) < _MIN_CHARS:
        return None, "the kept one was too short"
    return token, None


def kept_token(directory: Path, *, rotate: bool = False) -> KeptToken:
    """The token kept in `directory` (created 0700), or a new one written there (0600).

    A new one when there is none usable, or with `rotate`.

    Raises:
        TokenStoreError: the directory or the file is not the user's alone to write.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    tightened = _private_dir(directory)
    path = directory / TOKEN_FILE
    token, why = _read(path)
    if token is not None and not rotate:
        return KeptToken(token, path, None, tightened)
    new = secrets.token_urlsafe(24)
    partial = directory / f".{TOKEN_FILE}.{os.getpid()}"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # whatever the umask
        out.write(new + "\n")
    partial.replace(path)
    because = "--rotate-web-token" if rotate and token is not None else why
    return KeptToken(new, path, because, tightened)
