"""The directory of Postgres binaries and data outside a private checkout cannot be planted or swapped by others.

As root, `PostgresServer` runs a copy of the binaries from `shared_root()` as `devsched-pg`: whoever could write
there could run code as that account (and own the test and `up` databases). Only a directory we own, that nobody
else may write, is used; anything else is refused in one line, and left as it is.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from devsched.embedded import EmbeddedServerError
from devsched.embedded.postgres_server import shared_root

pytestmark = pytest.mark.security


def test_a_new_shared_root_is_ours_and_0755(tmp_path: Path) -> None:
    root = shared_root(tmp_path)
    assert root == tmp_path / f"devsched-{os.geteuid()}"
    st = root.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755)
    assert shared_root(tmp_path) == root  # reused


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_a_shared_root_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    planted = tmp_path / f"devsched-{os.geteuid()}"
    planted.mkdir()
    planted.chmod(mode)
    with pytest.raises(EmbeddedServerError, match=r"must be a directory owned by uid \d+ and writable only by it"):
        shared_root(tmp_path)
    assert stat.S_IMODE(planted.stat().st_mode) == mode  # refused, not repaired behind the user's back


def test_a_symlinked_shared_root_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / f"devsched-{os.geteuid()}").symlink_to(elsewhere)
    with pytest.raises(EmbeddedServerError, match="must be a directory"):
        shared_root(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another user")
def test_a_shared_root_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / f"devsched-{os.geteuid()}"
    planted.mkdir(mode=0o755)
    nobody = pwd.getpwnam("nobody")
    os.chown(planted, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(EmbeddedServerError, match="must be a directory owned by uid 0"):
        shared_root(tmp_path)
