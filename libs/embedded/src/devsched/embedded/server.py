"""A server run as a supervised child: a port kept across restarts, its data directory, readiness.

The server is a `ChildProcess` with `whole_tree`: `kill()` takes it and every process it started down
at once, as a crash of its machine would. If we die, the kernel sends it its own stop signal.
"""

from __future__ import annotations

import signal
import socket
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self

from devsched.embedded.supervisor import ChildProcess, EmbeddedServerError


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now.

    Another process may still take it before our server binds it; servers that chose their port
    this way retry with a new one when the bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def tcp_accepts(host: str, port: int) -> bool:
    """Tell whether something accepts TCP connections on `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class ServerProcess(ABC):
    """A server in a child process: `start()`, `stop()`, `kill()`, `restart()`, context manager.

    Subclasses say how to prepare the data directory, which command to run and when it is ready.
    The port is chosen once (at construction when not given) and kept across restarts, so clients
    reconnect to the same address and the data directory is reused.
    """

    #: Signal for a clean, prompt shutdown (also what the kernel sends the server when we die).
    stop_signal: signal.Signals = signal.SIGTERM
    #: Seconds to wait for readiness after spawning.
    start_timeout: float = 30.0
    #: Seconds to wait for a clean shutdown before SIGKILL.
    stop_timeout: float = 10.0
    #: Log lines that mean the port was taken between `free_port()` and our bind.
    port_in_use_markers: tuple[str, ...] = ("address already in use",)

    def __init__(self, data_dir: Path, port: int | None, host: str) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.host = host
        self._port_chosen = port is None
        self.port = free_port(host) if port is None else port
        self._child: ChildProcess | None = None
        self._started_once = False

    @property
    @abstractmethod
    def log_path(self) -> Path:
        """The file that gets the server's output."""

    @abstractmethod
    def _prepare(self) -> None:
        """Create what the server needs on disk before it runs (idempotent)."""

    @abstractmethod
    def _command(self) -> list[str]:
        """The argv of the server."""

    @abstractmethod
    def _ready(self) -> bool:
        """Tell whether the server answers clients (called in a bounded poll)."""

    def _run_as(self) -> tuple[int, int] | None:
        """The (uid, gid) to run the server as, or None for our own."""
        return None

    def _after_stop(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Clean up what only a running server needs (called after every stop or kill)."""

    @property
    def pid(self) -> int | None:
        """The server's pid while we have a child process, else None."""
        return None if self._child is None else self._child.pid

    @property
    def is_running(self) -> bool:
        """Tell whether the server process is alive (not whether it is ready)."""
        return self._child is not None and self._child.running

    def start(self) -> Self:
        """Start the server and wait until it answers; a no-op when it is running.

        Raises:
            EmbeddedServerError: it exited or did not become ready in time (with the log tail).
        """
        if self.is_running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        child = self._supervised()
        for attempt in range(3):
            child.argv = self._command()
            child.start()
            try:
                child.wait_ready(self._ready, timeout=self.start_timeout, what=f"{self} start")
            except EmbeddedServerError:
                fresh_log = child.log_text().lower()
                self.kill()
                port_taken = any(marker in fresh_log for marker in self.port_in_use_markers)
                if port_taken and self._port_chosen and not self._started_once and attempt < 2:
                    self.port = free_port(self.host)
                    continue
                raise
            except BaseException:  # Ctrl-C or a probe bug: never leave a half-started server behind
                self.kill()
                raise
            self._started_once = True
            return self
        raise AssertionError("unreachable")

    def stop(self, timeout: float | None = None) -> None:
        """Shut the server down cleanly, or SIGKILL all of it after `timeout` seconds.

        Idempotent. On return no process of the server is left alive.
        """
        if self._child is not None and self._child.pid is not None:
            self._child.stop(timeout)
            self._after_stop()

    def kill(self) -> None:
        """SIGKILL the server and every process it started: a crash, for chaos tests."""
        if self._child is not None and self._child.pid is not None:
            self._child.kill()
            self._after_stop()

    def pause(self) -> None:
        """SIGSTOP the server and every process it started: a frozen machine whose connections stay open."""
        if self._child is not None:
            self._child.pause()

    def resume(self) -> None:
        """SIGCONT what `pause()` stopped."""
        if self._child is not None:
            self._child.resume()

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the server's main process, by its pid (Postgres: SIGQUIT is an immediate shutdown)."""
        if self._child is not None:
            self._child.signal(sig)

    def wait_exit(self, timeout: float) -> None:
        """Wait until the server, and every process it started, has exited on its own (after `signal`).

        Raises:
            EmbeddedServerError: it still runs after `timeout` seconds.
        """
        if self._child is None:
            return
        if not self._child.wait(timeout):
            raise EmbeddedServerError(f"{self} still runs {timeout:.0f}s after it was told to exit")
        self._child.stop()  # reaps it and waits for what it started
        self._after_stop()

    def restart(self) -> Self:
        """Stop cleanly and start again on the same port with the same data."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host}:{self.port}, pid={self.pid}, data={self.data_dir})"

    def _supervised(self) -> ChildProcess:
        """The child that runs the server, made at the first start (subclasses set their fields after ours)."""
        if self._child is None:
            self._child = ChildProcess(
                type(self).__name__,
                self._command(),
                None,
                self.log_path,
                cwd=self.data_dir,
                run_as=self._run_as(),
                stop_signal=self.stop_signal,
                stop_timeout=self.stop_timeout,
                death_signal=self.stop_signal,
                whole_tree=True,
            )
        return self._child
