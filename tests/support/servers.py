"""Which real servers the tests use, behind one interface: given URL, Docker container or embedded.

Order of choice (for each of NATS and Postgres):

1. `DEVSCHED_TEST_NATS_URL` / `DEVSCHED_TEST_DATABASE_URL`: a server someone else runs; tests that
   restart or kill it are skipped.
2. A Docker engine that answers (testcontainers), unless `DEVSCHED_TEST_SERVERS=embedded`.
3. The embedded servers of `devsched.embedded` (pip-installed binaries), the default on CI here.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn, Protocol

import pytest
from sqlalchemy.engine import make_url

from devsched.embedded import NatsServer, PostgresServer


class ServerHandle(Protocol):
    """What fault-injection tests do to a server; each restart keeps its address and data."""

    @property
    def is_running(self) -> bool: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def restart(self) -> object: ...

    def kill(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def signal(self, sig: signal.Signals) -> None: ...

    def wait_exit(self, timeout: float) -> None: ...


class NatsHandle(ServerHandle, Protocol):
    """A NATS server with JetStream."""

    @property
    def url(self) -> str: ...


class PostgresHandle(ServerHandle, Protocol):
    """A Postgres server on which we may create databases; without an argument, the admin database."""

    def url(self, database: str = ...) -> str: ...

    def dsn(self, database: str = ...) -> str: ...


def _unsupported(what: str) -> NoReturn:
    pytest.skip(f"{what} is not possible on a server given by URL")


class ExternalNats:
    """A NATS server given by `DEVSCHED_TEST_NATS_URL`: used as is, never restarted."""

    is_running = True

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self) -> None:
        """Nothing to do: someone else runs it."""

    def stop(self) -> NoReturn:
        _unsupported("stopping NATS")

    def restart(self) -> NoReturn:
        _unsupported("restarting NATS")

    def kill(self) -> NoReturn:
        _unsupported("killing NATS")

    def pause(self) -> NoReturn:
        _unsupported("pausing NATS")

    def resume(self) -> None:
        """Nothing to do: it was never paused."""

    def signal(self, sig: signal.Signals) -> NoReturn:
        _unsupported(f"signalling NATS ({sig.name})")

    def wait_exit(self, timeout: float) -> NoReturn:
        _unsupported("waiting for NATS to exit")


class ExternalPostgres:
    """A Postgres server given by `DEVSCHED_TEST_DATABASE_URL`; its database is the admin database."""

    is_running = True

    def __init__(self, url: str) -> None:
        self._url = make_url(url)
        self.admin_database = self._url.database or "postgres"

    def url(self, database: str | None = None) -> str:
        """SQLAlchemy URL (asyncpg driver) of `database` on this server."""
        url = self._url.set(drivername="postgresql+asyncpg", database=database or self.admin_database)
        return url.render_as_string(hide_password=False)

    def dsn(self, database: str | None = None) -> str:
        """Plain `postgresql://` DSN of `database` on this server."""
        url = self._url.set(drivername="postgresql", database=database or self.admin_database)
        return url.render_as_string(hide_password=False)

    def start(self) -> None:
        """Nothing to do: someone else runs it."""

    def stop(self) -> NoReturn:
        _unsupported("stopping Postgres")

    def restart(self) -> NoReturn:
        _unsupported("restarting Postgres")

    def kill(self) -> NoReturn:
        _unsupported("killing Postgres")

    def pause(self) -> NoReturn:
        _unsupported("pausing Postgres")

    def resume(self) -> None:
        """Nothing to do: it was never paused."""

    def signal(self, sig: signal.Signals) -> NoReturn:
        _unsupported(f"signalling Postgres ({sig.name})")

    def wait_exit(self, timeout: float) -> NoReturn:
        _unsupported("waiting for Postgres to exit")


def docker_available() -> bool:
    """Tell, quickly and without hanging, whether a Docker engine answers here."""
    if os.environ.get("DEVSCHED_TEST_SERVERS", "auto") == "embedded":
        return False
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    import docker  # imported only where an engine may exist

    # The docker client leaks its socket when the engine is absent; with `filterwarnings = error`
    # that ResourceWarning would fail whichever test the garbage collector happens to run in.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            client = docker.from_env(timeout=3)
            try:
                client.ping()
            finally:
                client.close()
        except Exception:  # any failure means "no usable engine"
            answered = False
        else:
            answered = True
        gc.collect()
    return answered


def describe_sources() -> str:
    """Say where this run's NATS and Postgres come from, for the report header."""
    fallback = "docker" if docker_available() else "embedded"
    nats_source = "DEVSCHED_TEST_NATS_URL" if os.environ.get("DEVSCHED_TEST_NATS_URL") else fallback
    pg_source = "DEVSCHED_TEST_DATABASE_URL" if os.environ.get("DEVSCHED_TEST_DATABASE_URL") else fallback
    return f"NATS from {nats_source}, Postgres from {pg_source}"


@contextmanager
def nats_for_tests(tmp_dir: Path) -> Iterator[NatsHandle]:
    """Yield the NATS server of a test session, and stop it afterwards if we started it."""
    if url := os.environ.get("DEVSCHED_TEST_NATS_URL"):
        yield ExternalNats(url)
    elif docker_available():
        from support.containers import NatsContainerServer  # needs Docker

        with NatsContainerServer() as container:
            yield container
    else:
        with NatsServer(tmp_dir) as server:
            yield server


@contextmanager
def postgres_for_tests() -> Iterator[PostgresHandle]:
    """Yield the Postgres server of a test session, and stop it afterwards if we started it."""
    if url := os.environ.get("DEVSCHED_TEST_DATABASE_URL"):
        yield ExternalPostgres(url)
    elif docker_available():
        from support.containers import PostgresContainerServer  # needs Docker

        with PostgresContainerServer() as container:
            yield container
    else:
        with scratch_dir("devsched-test-pg-") as data_dir, PostgresServer(data_dir) as server:
            yield server


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """Yield a new directory for a server's data, in memory where possible; remove it afterwards.

    On tmpfs (/dev/shm) cloning the template database takes ~15 ms against ~270 ms on this disk,
    even with fsync off. Not under pytest's basetemp: that is private to root (0700), and as root
    Postgres runs as another user, who must be able to walk down to its data directory.
    """
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
