"""The test harness itself: embedded servers start, answer, survive restarts and die when told."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import StorageType

from devsched.embedded import NatsServer, PostgresServer, free_port
from support.databases import TEMPLATE
from support.polling import eventually
from support.servers import NatsHandle, PostgresHandle, scratch_dir

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    """Tell whether `pid` is a live process (a zombie is dead: it holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (Postgres backends live in sessions of their own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """An embedded NATS server of this test's own."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def own_pg() -> Iterator[PostgresServer]:
    """An embedded Postgres of this test's own."""
    with scratch_dir("devsched-harness-pg-") as data_dir, PostgresServer(data_dir) as server:
        yield server


async def _connect(url: str) -> NatsClient:
    async def quiet(_: Exception) -> None:
        """Disconnections are the point of these tests."""

    return await nats.connect(url, error_cb=quiet)


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("select 1"))
    finally:
        await conn.close()


async def _stream_messages(nc: NatsClient, stream: str) -> int:
    info = await nc.jetstream().stream_info(stream)
    return int(info.state.messages)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_both_servers_start_on_free_ports(own_nats: NatsServer, own_pg: PostgresServer) -> None:
    assert own_nats.is_running
    assert own_pg.is_running
    assert own_nats.port != own_pg.port
    assert own_nats.url == f"nats://127.0.0.1:{own_nats.port}"
    assert own_pg.url("x") == f"postgresql+asyncpg://postgres@127.0.0.1:{own_pg.port}/x"
    assert own_pg.dsn() == f"postgresql://postgres@127.0.0.1:{own_pg.port}/postgres"


def test_jetstream_syncs_every_write_before_acknowledging_it(tmp_path: Path) -> None:
    # The server of the tests and of `devsched up`: `sync_interval: always` (Jepsen lost acknowledged writes
    # with the default), as the server itself reports it.
    with NatsServer(tmp_path / "nats", http_port=free_port()) as server:
        assert server.http_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/varz", timeout=5) as reply:
            config = json.load(reply)["jetstream"]["config"]
    assert config["sync_always"] is True


async def test_jetstream_answers(nc: NatsClient, subject_prefix: str) -> None:
    js = nc.jetstream()
    await js.add_stream(name=subject_prefix, subjects=[f"{subject_prefix}.>"], storage=StorageType.MEMORY)
    ack = await js.publish(f"{subject_prefix}.hello", b"world")
    msg = await js.get_msg(subject_prefix, ack.seq)
    assert msg.data == b"world"
    await js.delete_stream(subject_prefix)


async def test_postgres_answers(database_url: str) -> None:
    assert await _select_one(_plain(database_url)) == 1


async def test_each_test_gets_a_clone_of_the_template(database_url: str) -> None:
    conn = await asyncpg.connect(_plain(database_url))
    try:
        template_oid = await conn.fetchval("select oid from pg_database where datname = $1", TEMPLATE)
        current = await conn.fetchval("select current_database()")
    finally:
        await conn.close()
    assert template_oid is not None
    assert current.startswith("test_")


async def test_nats_restart_keeps_streams(own_nats: NatsServer) -> None:
    nc = await _connect(own_nats.url)
    await nc.jetstream().add_stream(name="kept", subjects=["kept.>"], storage=StorageType.FILE)
    await nc.jetstream().publish("kept.one", b"1")
    await nc.close()
    port = own_nats.port

    own_nats.restart()

    assert own_nats.port == port
    nc = await _connect(own_nats.url)
    try:
        assert await _stream_messages(nc, "kept") == 1
    finally:
        await nc.close()


async def test_postgres_restart_keeps_tables(own_pg: PostgresServer) -> None:
    conn = await asyncpg.connect(own_pg.dsn())
    await conn.execute("create table kept (n int); insert into kept values (7)")
    await conn.close()

    own_pg.restart()

    conn = await asyncpg.connect(own_pg.dsn())
    try:
        assert await conn.fetchval("select n from kept") == 7
    finally:
        await conn.close()


async def test_killed_servers_start_again_with_their_data(own_nats: NatsServer, own_pg: PostgresServer) -> None:
    conn = await asyncpg.connect(own_pg.dsn())
    await conn.execute("create table survived (n int); insert into survived values (1)")
    nats_pid, pg_pid = own_nats.pid, own_pg.pid
    assert nats_pid is not None
    assert pg_pid is not None
    backends = _children(pg_pid)
    assert backends

    own_nats.kill()
    own_pg.kill()

    conn.terminate()
    assert not own_nats.is_running
    assert not own_pg.is_running
    assert not any(_alive(pid) for pid in [nats_pid, pg_pid, *backends])
    own_nats.start()
    own_pg.start()
    nc = await _connect(own_nats.url)
    await nc.close()
    conn = await asyncpg.connect(own_pg.dsn())
    try:
        assert await conn.fetchval("select n from survived") == 1
    finally:
        await conn.close()


def test_stop_leaves_no_process(own_nats: NatsServer, own_pg: PostgresServer) -> None:
    nats_pid, pg_pid = own_nats.pid, own_pg.pid
    assert nats_pid is not None
    assert pg_pid is not None
    pids = [nats_pid, pg_pid, *_children(pg_pid)]

    own_nats.stop()
    own_pg.stop()
    own_nats.stop()  # idempotent

    assert (own_nats.pid, own_pg.pid) == (None, None)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.chaos
async def test_session_nats_comes_back_and_clients_reconnect(
    nats_server: NatsHandle, nc: NatsClient, subject_prefix: str
) -> None:
    js = nc.jetstream()
    await js.add_stream(name=subject_prefix, subjects=[f"{subject_prefix}.>"], storage=StorageType.FILE)
    await js.publish(f"{subject_prefix}.before", b"1")
    reconnects = nc.stats["reconnects"]

    nats_server.kill()
    nats_server.start()

    # `is_connected` alone is still true until the client notices the dead socket.
    await eventually(lambda: nc.is_connected and nc.stats["reconnects"] > reconnects, message="client reconnected")
    await js.publish(f"{subject_prefix}.after", b"2")
    assert await _stream_messages(nc, subject_prefix) == 2
    await js.delete_stream(subject_prefix)


@pytest.mark.chaos
async def test_session_postgres_restarts_under_a_test_database(
    postgres_server: PostgresHandle, database_url: str
) -> None:
    postgres_server.restart()

    assert await _select_one(_plain(database_url)) == 1


@pytest.mark.chaos
def test_a_test_may_leave_the_session_servers_stopped(
    nats_server: NatsHandle, postgres_server: PostgresHandle, database_url: str
) -> None:
    nats_server.stop()
    postgres_server.kill()

    assert not nats_server.is_running
    assert not postgres_server.is_running


async def test_session_servers_run_again_after_a_test_stopped_them(database_url: str, nc: NatsClient) -> None:
    assert nc.is_connected
    assert await _select_one(_plain(database_url)) == 1


async def test_eventually_reports_what_never_happened() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"the moon: still false after 0\.1s"):
        await eventually(never, timeout=0.1, interval=0.01, message="the moon")
