"""NATS and Postgres in Docker containers (testcontainers), for machines that have an engine.

Host ports are bound explicitly (not left to Docker) so that a container restarted by a chaos test
comes back on the same address, like the embedded servers do.
"""

from __future__ import annotations

import signal
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from testcontainers.core.container import DockerContainer

from devsched.embedded import free_port, jetstream_ready, postgres_ready, wait_until


class _ContainerServer:
    """One container with stop/kill/restart that keep its filesystem, hence the data."""

    def __init__(self, container: DockerContainer, port: int, ready: Callable[[str, int], bool]) -> None:
        self.host_port = free_port()
        self._container = container.with_bind_ports(port, self.host_port)
        self._ready = ready
        self._created = False

    @property
    def host(self) -> str:
        """The address of the Docker host, where the port is published."""
        return str(self._container.get_container_host_ip())

    @property
    def _wrapped(self) -> Any:
        return self._container.get_wrapped_container()

    @property
    def is_running(self) -> bool:
        """Tell whether the container is running."""
        if not self._created:
            return False
        self._wrapped.reload()
        return bool(self._wrapped.status == "running")

    def start(self) -> Self:
        """Create and start the container the first time, start it again later; wait until ready."""
        if not self._created:
            with warnings.catch_warnings():  # testcontainers deprecates its own helpers
                warnings.simplefilter("ignore", DeprecationWarning)
                self._container.start()
            self._created = True
        elif not self.is_running:
            self._wrapped.start()
        self._wait_ready()
        return self

    def stop(self) -> None:
        """Stop the container cleanly (it can be started again with its data)."""
        if self._created:
            self._wrapped.stop(timeout=10)

    def kill(self) -> None:
        """SIGKILL the container's processes."""
        if self._created:
            self._wrapped.kill()

    def pause(self) -> None:
        """Freeze every process of the container (`docker pause`); connections stay open."""
        if self._created:
            self._wrapped.pause()

    def resume(self) -> None:
        """Thaw what `pause()` froze."""
        if self._created and self._wrapped.status == "paused":
            self._wrapped.unpause()

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the container's main process (`docker kill --signal`)."""
        if self._created:
            self._wrapped.kill(signal=sig.name)

    def wait_exit(self, timeout: float) -> None:
        """Wait until the container has stopped on its own (after `signal`)."""
        wait_until(lambda: not self.is_running, timeout=timeout, what=f"container {self.host_port} exit")

    def restart(self) -> Self:
        """Stop and start again, same port, same data."""
        self.stop()
        return self.start()

    def remove(self) -> None:
        """Remove the container and its data."""
        if self._created:
            self._container.stop()
            self._created = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()

    def _wait_ready(self) -> None:
        host = self.host
        wait_until(lambda: self._ready(host, self.host_port), timeout=60.0, what=f"container {self.host_port}")


class NatsContainerServer(_ContainerServer):
    """The official NATS image with JetStream on a file store inside the container, synced at every write."""

    def __init__(self, image: str = "nats:2.11-alpine") -> None:
        # `sync_interval: always` has no flag: a config file written at start (as the embedded server's)
        config = "echo 'jetstream { sync_interval: always }' > /tmp/nats.conf"
        command = f'sh -c "{config}; exec nats-server -c /tmp/nats.conf -js -sd /data"'
        super().__init__(DockerContainer(image).with_command(command), 4222, jetstream_ready)

    @property
    def url(self) -> str:
        """The client URL."""
        return f"nats://{self.host}:{self.host_port}"


class PostgresContainerServer(_ContainerServer):
    """The official Postgres image, with the same fast settings as the embedded server."""

    def __init__(self, image: str = "postgres:17-alpine") -> None:
        container = (
            DockerContainer(image)
            .with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
            .with_command(
                # synchronous_commit stays on: chaos tests crash the server and count on what it acknowledged
                "postgres -c fsync=off -c full_page_writes=off -c max_connections=200 -c shared_buffers=128MB"
            )
        )
        super().__init__(container, 5432, postgres_ready)

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (asyncpg driver) of `database`."""
        return f"postgresql+asyncpg://postgres@{self.host}:{self.host_port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """Plain `postgresql://` DSN of `database`."""
        return f"postgresql://postgres@{self.host}:{self.host_port}/{database}"
