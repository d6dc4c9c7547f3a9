"""A NATS cluster on one machine: several nats-servers with JetStream, routed to each other on loopback.

ARCHITECTURE's scale path runs NATS as a cluster of three with streams of three replicas; this is that engine,
small enough for a test or a laptop. Each node is a `NatsServer` of its own (its own ports, store and log,
`sync_interval: always`), with a monitoring port, through which readiness is judged: the cluster serves
JetStream once its meta group has elected a leader, a moment after the nodes answer clients.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from devsched.embedded.nats_server import ClusterSpec, NatsServer
from devsched.embedded.server import free_port
from devsched.embedded.supervisor import wait_until


class NatsCluster:
    """`size` routed nats-servers under `data_dir/n0`, `n1`, ...; `start()` returns once JetStream is clustered.

    Args:
        data_dir: Home of the nodes, one directory each.
        size: How many nodes (three for replicas of three that survive one node).
        host: Where every node listens; loopback, since nothing here is authenticated.
        name: The cluster's name.
    """

    #: Seconds `start()` waits for the meta group's leader once the nodes answer.
    elect_timeout: float = 30.0

    def __init__(self, data_dir: Path, size: int = 3, host: str = "127.0.0.1", name: str = "devsched") -> None:
        route_ports = [free_port(host) for _ in range(size)]
        routes = tuple(f"nats-route://{host}:{port}" for port in route_ports)
        self.nodes = [
            NatsServer(
                Path(data_dir) / f"n{i}",
                host=host,
                http_port=free_port(host),
                cluster=ClusterSpec(name, f"n{i}", route_ports[i], routes),
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        """The client URL of every node."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (what `DEVSCHED_NATS_URL` takes for a cluster)."""
        return ",".join(self.urls)

    def node(self, server_name: str) -> NatsServer:
        """The node called `server_name` (`n0`, ...), as the cluster reports leaders."""
        for node in self.nodes:
            if node.cluster is not None and node.cluster.server_name == server_name:
                return node
        raise KeyError(server_name)

    def jsz(self, node: NatsServer) -> dict[str, Any] | None:
        """The node's JetStream report (`/jsz`), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{node.host}:{node.http_port}/jsz", timeout=2) as reply:
                report: dict[str, Any] = json.load(reply)
                return report
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def meta_leader(self) -> str | None:
        """The server name of the JetStream meta group's leader, as a running node sees it (None: no leader)."""
        for node in self.nodes:
            if node.is_running and (report := self.jsz(node)) is not None:
                leader = report.get("meta_cluster", {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def start(self) -> Self:
        """Start every node not running, then wait until the meta group has a leader.

        Raises:
            EmbeddedServerError: a node did not start, or no leader was elected in time.
        """
        for node in self.nodes:
            node.start()
        wait_until(lambda: self.meta_leader() is not None, timeout=self.elect_timeout, what="NATS cluster leader")
        return self

    def stop(self) -> None:
        """Stop every node cleanly."""
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
