"""A server run as a child process that we own: spawn, readiness, stop, kill, restart.

Every server runs in a session of its own so that a terminal's Ctrl-C reaches only us (we stop the
servers in order), and `kill()` takes the server and every process it started down at once, as a
crash of its machine would. If we die, the kernel tells the server to stop (Linux, best effort).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(RuntimeError):
    """A local server did not start or stop as expected; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now.

    Another process may still take it before our server binds it; servers that chose their port
    this way retry with a new one when the bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    abort: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll `check` until it is true, for at most `timeout` seconds.

    A bounded poll instead of a fixed sleep: start-up takes 50 ms on a quiet machine and seconds on a
    loaded CI runner. `abort` returns a reason to give up early (the process died).
    """
    deadline = time.monotonic() + timeout
    interval = 0.01
    while True:
        if check():
            return
        reason = abort()
        if reason is not None:
            raise EmbeddedServerError(f"{what}: {reason}")
        if time.monotonic() >= deadline:
            raise EmbeddedServerError(f"{what}: not done after {timeout:.1f}s")
        time.sleep(interval)
        interval = min(interval * 2, 0.1)


def tcp_accepts(host: str, port: int) -> bool:
    """Tell whether something accepts TCP connections on `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 30) -> str:
    """Return the last `lines` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _processes() -> dict[int, tuple[str, int, int]]:
    """Map each pid to (state, ppid, pgrp), read from /proc (empty where there is no /proc)."""
    table: dict[int, tuple[str, int, int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[-1].split()
        table[int(entry.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def _descendants(pid: int) -> set[int]:
    """Return the pids of every live descendant of `pid`.

    Postgres puts each backend in a session of its own, so signalling the postmaster's process
    group does not reach them: they have to be found by parentage.
    """
    children: dict[int, list[int]] = {}
    for child, (_, ppid, _) in _processes().items():
        children.setdefault(ppid, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids: set[int], pgid: int) -> bool:
    """Tell whether any of `pids`, or any member of group `pgid`, is still a live process.

    Zombies count as gone: orphans reparented to an init that does not reap them stay zombies
    forever but hold no port, no shared memory and no file.
    """
    table = _processes()
    if not table:  # not Linux: the best we can do is the signal probe
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return any(state not in ("Z", "X") and (pid in pids or pgrp == pgid) for pid, (state, _, pgrp) in table.items())


def parent_death_hook(sig: int) -> Callable[[], None] | None:
    """Build a preexec_fn that has the kernel send `sig` to the child when we die.

    The kernel sends it when the *thread* that forked exits, so it is only set when spawning from the
    main thread (a worker thread of a pool may exit long before the server should). It must run after
    the switch of user (a change of credentials clears it); `subprocess` runs preexec_fn after
    applying `user=`/`group=`.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # we died between fork and prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


class ServerProcess(ABC):
    """A server in a child process: `start()`, `stop()`, `kill()`, `restart()`, context manager.

    Subclasses say how to prepare the data directory, which command to run and when it is ready.
    The port is chosen once (at construction when not given) and kept across restarts, so clients
    reconnect to the same address and the data directory is reused.
    """

    #: Signal for a clean, prompt shutdown.
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
        self._proc: subprocess.Popen[bytes] | None = None
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
        return None if self._proc is None else self._proc.pid

    @property
    def is_running(self) -> bool:
        """Tell whether the server process is alive (not whether it is ready)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the server and wait until it answers; a no-op when it is running.

        Raises:
            EmbeddedServerError: it exited or did not become ready in time (with the log tail).
        """
        if self.is_running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        for attempt in range(3):
            log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn()
            try:
                wait_until(self._ready, timeout=self.start_timeout, what=f"{self} start", abort=self._exited)
            except EmbeddedServerError as exc:
                self.kill()
                fresh_log = self._log_since(log_size).lower()
                port_taken = any(marker in fresh_log for marker in self.port_in_use_markers)
                if port_taken and self._port_chosen and not self._started_once and attempt < 2:
                    self.port = free_port(self.host)
                    continue
                raise EmbeddedServerError(f"{exc}\n--- {self.log_path} ---\n{tail(self.log_path)}") from None
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
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.kill(proc.pid, self.stop_signal)
                proc.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
            except ProcessLookupError:
                pass
        self._finish(proc, set())

    def kill(self) -> None:
        """SIGKILL the server and every process it started: a crash, for chaos tests."""
        proc = self._proc
        if proc is None:
            return
        family: set[int] = set()
        if proc.poll() is None:
            # Frozen, it forks nothing new while we list its children.
            os.kill(proc.pid, signal.SIGSTOP)
            family = _descendants(proc.pid)
            # Our child leads its own session, so its pid is its group's id.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._finish(proc, family)

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

    def _spawn(self) -> None:
        account = self._run_as()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_hook(self.stop_signal),
                cwd=self.data_dir,
                user=None if account is None else account[0],
                group=None if account is None else account[1],
                extra_groups=None if account is None else [],
            )

    def _exited(self) -> str | None:
        if self._proc is not None and (code := self._proc.poll()) is not None:
            return f"exited with code {code}"
        return None

    def _finish(self, proc: subprocess.Popen[bytes], family: set[int]) -> None:
        proc.wait()
        # SIGKILL takes effect at once, but a restart must not race a backend still holding the
        # shared memory or the port; a clean shutdown has already waited for all of them.
        wait_until(lambda: not _alive(family, proc.pid), timeout=10.0, what=f"{self} exit")
        self._proc = None
        self._after_stop()

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""
