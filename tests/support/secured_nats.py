"""A nats-server with the committed deploy accounts (deploy/nats/accounts.conf), for tests that need the
production permissions: plain-text passwords are put in for the placeholders, and a second host account
`bench-08` is added with the generator (deploy/nats/host_user.py).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import nats
from nats.aio.client import Client as NatsClient

from devsched.embedded import ChildProcess, free_port, nats_server_binary
from devsched.embedded.server import tcp_accepts
from devsched.protocol.subjects import Subjects
from support.scheduler_harness import TestHost

NATS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "nats"
#: The subject prefix the accounts are written for (the default).
PREFIX = "devsched"
#: The placeholder of each service user and its password in the tests.
PASSWORDS = {
    "THE.SCHEDULER": "schedpw",
    "THE.SWEEPER": "sweeppw",
    "THE.OPERATOR": "oppw",
    "THE.WEB": "webpw",
    "THIS.HOSTS": "h07pw",
}
#: Users and passwords, by role.
USERS = {
    "scheduler": ("scheduler", "schedpw"),
    "sweeper": ("sweeper", "sweeppw"),
    "operator": ("operator", "oppw"),
    "web": ("web", "webpw"),
    "bench-07": ("host-bench-07", "h07pw"),
    "bench-08": ("host-bench-08", "h08pw"),
}
#: The scheduler settings that go with these accounts (hosts answered under the server's `_R_.` replies).
SCHEDULER_SETTINGS = {"host_inbox_prefixes": "_R_."}
#: The agent.toml keys that go with these accounts.
AGENT_TOML = 'jetstream_api_prefix = "devsched.js.API"\n'


def host_user_module() -> ModuleType:
    """deploy/nats/host_user.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("deploy_nats_host_user_support", NATS_DIR / "host_user.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def accounts_text() -> str:
    """accounts.conf with plain-text passwords, plus a second host `bench-08` from the generator."""
    host_user = host_user_module()
    text = (NATS_DIR / "accounts.conf").read_text()
    for who, password in PASSWORDS.items():
        text = text.replace(f"$2a$11$REPLACE.WITH.THE.BCRYPT.HASH.OF.{who}.PASSWORD", password)
    bench_08 = host_user.render("bench-08").replace(host_user.PLACEHOLDER_HASH, USERS["bench-08"][1])
    assert "REPLACE.WITH" not in text, "a placeholder was not replaced"
    return text.replace("# END host-bench-07", "# END host-bench-07\n" + bench_08)


@dataclass(frozen=True)
class SecuredNats:
    """The running server: `address` is `host:port`."""

    address: str

    def url(self, role: str) -> str:
        """`nats://user:password@host:port` for a role of `USERS`."""
        user, password = USERS[role]
        return f"nats://{user}:{password}@{self.address}"


@contextmanager
def configured_nats(directory: Path, config: str = "") -> Iterator[str]:
    """A nats-server on a free loopback port, JetStream under `directory`, with `config` (lines of the
    server's configuration, such as `tls {...}` or an include) added; yields `host:port` once it listens.
    Stopped by its pid."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "nats.conf"
    conf.write_text(
        "{\n"
        f'  "host": "127.0.0.1", "port": {port},\n'
        f'  "jetstream": {{"store_dir": "{directory / "js"}"}},\n'
        f"{config}\n"
        "}\n"
    )
    server = ChildProcess(
        "nats-server", [str(nats_server_binary()), "-c", str(conf)], None, directory / "nats.log", stop_timeout=10.0
    ).start()
    try:
        server.wait_ready(lambda: tcp_accepts("127.0.0.1", port), timeout=15.0, what=f"nats-server on port {port}")
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


@contextmanager
def secured_nats(directory: Path) -> Iterator[SecuredNats]:
    """Run a nats-server with the deploy accounts on a free loopback port, its files under `directory`."""
    (directory / "devsched").mkdir(parents=True)
    (directory / "devsched" / "accounts.conf").write_text(accounts_text())
    with configured_nats(directory, "  include ./devsched/accounts.conf;") as address:
        yield SecuredNats(address)


class HostConnection:
    """A host's own connection (its inbox prefix, as the agent connects), with the errors the server sent."""

    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        self.violations: list[str] = []
        self.nc: NatsClient | None = None

    async def connect(self, server: SecuredNats) -> NatsClient:
        async def on_error(exc: Exception) -> None:
            self.violations.append(str(exc).lower())

        self.nc = await nats.connect(
            server.url(self.host_id), inbox_prefix=f"_INBOX.{self.host_id}", error_cb=on_error, allow_reconnect=False
        )
        return self.nc


async def account_host(server: SecuredNats, host_id: str) -> tuple[TestHost, HostConnection]:
    """A protocol-only test host that speaks through its own account, as a real (or hostile) agent would: its
    consumer is reached through the API prefix its imports map. The connection holds the server's refusals
    (`violations`); close its `nc` after."""
    connection = HostConnection(host_id)
    nc = await connection.connect(server)
    host = TestHost(nc, PREFIX, host_id)
    host.js = nc.jetstream(prefix=Subjects(PREFIX).host_jetstream_api)
    return host, connection
