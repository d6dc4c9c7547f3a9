"""A nats-server with the committed deploy accounts (deploy/nats/accounts.conf), for tests that need the
production permissions: plain-text passwords are put in for the placeholders, and a second host account
`bench-08` (and any more a test names) is added with the generator (deploy/nats/host_user.py).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import nats
from nats.aio.client import Client as NatsClient

from devsched.embedded import ChildProcess, free_port, nats_server_binary
from devsched.embedded.server import tcp_accepts
from devsched.protocol.subjects import Subjects
from support.polling import eventually
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


def host_credentials(host_id: str) -> tuple[str, str]:
    """The user and password of a host account: `bench-07`'s and `bench-08`'s of `USERS`, or the generator's
    user `host-<id>` with the password `<id>pw` for any other host a test adds."""
    return USERS.get(host_id, (f"host-{host_id}", f"{host_id}pw"))


def accounts_text(hosts: Sequence[str] = ()) -> str:
    """accounts.conf with plain-text passwords, plus a second host `bench-08` and each of `hosts` from the
    generator, as an operator adds them."""
    host_user = host_user_module()
    text = (NATS_DIR / "accounts.conf").read_text()
    for who, password in PASSWORDS.items():
        text = text.replace(f"$2a$11$REPLACE.WITH.THE.BCRYPT.HASH.OF.{who}.PASSWORD", password)
    assert "REPLACE.WITH" not in text, "a placeholder was not replaced"
    added = [
        host_user.render(host_id).replace(host_user.PLACEHOLDER_HASH, host_credentials(host_id)[1])
        for host_id in dict.fromkeys(["bench-08", *hosts])
        if host_id != "bench-07"
    ]
    return text.replace("# END host-bench-07", "\n".join(["# END host-bench-07", *added]))


@dataclass(frozen=True)
class SecuredNats:
    """The running server: `address` is `host:port`; `hosts` the host accounts added to the deploy's."""

    address: str
    hosts: tuple[str, ...] = ()

    def url(self, role: str) -> str:
        """`nats://user:password@host:port` for a role of `USERS` or a host of `hosts`."""
        user, password = USERS[role] if role in USERS else host_credentials(role)
        assert role in USERS or role in self.hosts, f"no account for {role}"
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
def secured_nats(directory: Path, hosts: Sequence[str] = ()) -> Iterator[SecuredNats]:
    """Run a nats-server with the deploy accounts (and an account for each of `hosts`, made by the generator)
    on a free loopback port, its files under `directory`."""
    (directory / "devsched").mkdir(parents=True)
    (directory / "devsched" / "accounts.conf").write_text(accounts_text(hosts))
    with configured_nats(directory, "  include ./devsched/accounts.conf;") as address:
        yield SecuredNats(address, tuple(hosts))


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

    async def refused_publish(self, subject: str, data: bytes = b"{}") -> None:
        """Publish to `subject`, which the host's user may not, and wait until the server refuses it: a
        permissions violation naming the subject, reported on this connection (the message goes nowhere)."""
        assert self.nc is not None
        await self.nc.publish(subject, data, reply=f"_INBOX.{self.host_id}.refused")
        await self.nc.flush()
        await eventually(
            lambda: any("publish" in v and subject.lower() in v for v in self.violations),
            timeout=5.0,
            message=f"the server refuses {self.host_id}'s publish to {subject}",
        )


async def account_host(server: SecuredNats, host_id: str) -> tuple[TestHost, HostConnection]:
    """A protocol-only test host that speaks through its own account, as a real (or hostile) agent would: its
    consumer is reached through the API prefix its imports map. The connection holds the server's refusals
    (`violations`); close its `nc` after."""
    connection = HostConnection(host_id)
    nc = await connection.connect(server)
    host = TestHost(nc, PREFIX, host_id)
    host.js = nc.jetstream(prefix=Subjects(PREFIX).host_jetstream_api)
    return host, connection
