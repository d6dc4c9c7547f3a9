"""The one supervisor of our child processes: servers, services, and the commands tests run.

A child runs in a session of its own, so that a terminal's Ctrl-C reaches only us (we stop children in
order); its output is appended to a log file; it is signalled by pid only. It dies with us:

- the kernel sends it `death_signal` when we die, even by SIGKILL (Linux `PR_SET_PDEATHSIG`). The kernel
  ties that signal to the *thread* that forked, not to the process: a child forked by a worker thread
  would get it as soon as that thread ends (the threads of `asyncio.to_thread` end with their event loop),
  so children are forked by the main thread or by one spawner thread that lives as long as the process;
- at a normal exit an atexit hook stops every child still running. A Python process killed by SIGTERM
  runs no atexit hook and no `finally`: `exit_on_sigterm` turns SIGTERM into KeyboardInterrupt, so that
  they run (pytest then also tears its fixtures down).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from signal import Signals
from types import FrameType
from typing import Any, Self, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
#: Seconds the atexit hook gives the children still running to stop before it SIGKILLs them.
EXIT_STOP_TIMEOUT = 5.0


class EmbeddedServerError(RuntimeError):
    """A child process or local server did not start, answer or stop as expected; the message carries its log tail."""


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


def tail(path: Path, lines: int = 30) -> str:
    """Return the last `lines` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


# -- the process table ------------------------------------------------------------------------------------


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


# -- dying with us ------------------------------------------------------------------------------------------


def _death_hook(sig: int | None) -> Callable[[], None] | None:
    """Build a preexec_fn that has the kernel send `sig` to the child when its forking thread ends.

    It runs after `subprocess` has switched the user (a change of credentials clears the setting).
    """
    if sig is None or not sys.platform.startswith("linux"):
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


class _Spawner:
    """Runs the forks of other threads on one daemon thread, which ends only with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fork: Callable[[], T]) -> T:
        """Call `fork` on a thread that lives as long as the process, and return what it returns."""
        if threading.current_thread() is threading.main_thread():
            return fork()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="devsched-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fork, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            fork, future = self._jobs.get()
            try:
                future.set_result(fork())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


_SPAWNER = _Spawner()
_RUNNING: list[ChildProcess] = []
_RUNNING_LOCK = threading.Lock()


def _stop_leftovers() -> None:
    """At exit: stop every child still running, the last started first."""
    with _RUNNING_LOCK:
        children = list(reversed(_RUNNING))
    stop_all(children, timeout=EXIT_STOP_TIMEOUT)


atexit.register(_stop_leftovers)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def exit_on_sigterm() -> bool:
    """Make SIGTERM raise KeyboardInterrupt in this process, as Ctrl-C does, so that cleanup runs.

    Installed only from the main thread and only where SIGTERM has no handler yet. Returns whether it was.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _interrupt)
    return True


# -- one child ------------------------------------------------------------------------------------------------


class ChildProcess:
    """A child process we own: `start`, `wait_ready`, `stop`, `kill`, `pause`/`resume`, `restart`, its log.

    Args:
        name: For people and error messages (`scheduler`, `agent sim-1`).
        argv: The command; it may be changed between runs (a server that moves to another port).
        env: Its whole environment; ours when None.
        log_path: Where its stdout and stderr go, appended; `log_text` reads the current run's part.
        cwd: Its working directory; ours when None.
        run_as: The (uid, gid) it runs as, with no supplementary groups; ours when None.
        stop_signal: The signal that asks it to shut down cleanly.
        stop_timeout: Seconds `stop()` waits after `stop_signal` before it SIGKILLs.
        death_signal: What the kernel sends it when we die (None: nothing). SIGKILL ends a paused child too;
            a catchable signal lets it shut down cleanly, unless it is paused.
        whole_tree: `kill()` and `pause()` reach every process it started (a crash or a hang of its machine)
            and `stop()`/`kill()` return once all of them are gone; otherwise they reach the child alone.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        log_path: Path,
        *,
        cwd: Path | None = None,
        run_as: tuple[int, int] | None = None,
        stop_signal: Signals = Signals.SIGTERM,
        stop_timeout: float = 10.0,
        death_signal: Signals | None = Signals.SIGKILL,
        whole_tree: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = None if env is None else dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.run_as = run_as
        self.stop_signal = stop_signal
        self.stop_timeout = stop_timeout
        self.death_signal = death_signal
        self.whole_tree = whole_tree
        #: How many times it was started.
        self.starts = 0
        self._popen: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._log_offset = 0

    # -- state -----------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid of the current run, until `stop()` or `kill()` has ended it."""
        return None if self._popen is None or self._stopped else self._popen.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive (not whether it is ready)."""
        return self._poll() is None and self._popen is not None

    @property
    def exit_code(self) -> int | None:
        """The exit code of the current run once it has exited (-N when signal N ended it), else None."""
        return self._poll()

    def _poll(self) -> int | None:
        if self._popen is None:
            return None
        code = self._popen.poll()
        if code is not None:
            _forget(self)
        return code

    # -- life ------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start a run (a no-op while one runs); its output is appended to `log_path`."""
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        account = self.run_as
        with self.log_path.open("ab") as log:
            self._popen = _SPAWNER.run(
                lambda: subprocess.Popen(
                    self.argv,
                    env=self.env,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_death_hook(self.death_signal),
                    user=None if account is None else account[0],
                    group=None if account is None else account[1],
                    extra_groups=None if account is None else [],
                )
            )
        self._stopped = False
        self.starts += 1
        with _RUNNING_LOCK:
            _RUNNING.append(self)
        return self

    def wait_ready(self, check: Callable[[], bool], *, timeout: float, what: str | None = None) -> Self:
        """Poll `check` until it is true (at most `timeout` seconds); give up at once if the process exits.

        Raises:
            EmbeddedServerError: it exited or `check` stayed false; the message ends with the log's tail.
        """
        try:
            wait_until(check, timeout=timeout, what=what or f"{self.name} ready", abort=self._exit_reason)
        except EmbeddedServerError as exc:
            raise EmbeddedServerError(f"{exc}\n--- {self.log_path} ---\n{self.tail()}") from None
        return self

    def signal(self, sig: Signals) -> None:
        """Send `sig` to the process, by its pid, while it runs."""
        if self.running:
            assert self._popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, sig)

    def pause(self) -> None:
        """SIGSTOP it (`whole_tree`: with its descendants): it hangs, keeping its connections, as a frozen machine."""
        self._signal_tree(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT what `pause()` stopped."""
        self._signal_tree(signal.SIGCONT)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Paused for the block, resumed afterwards (also when the block fails)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the process to exit; True when it has (or never ran)."""
        if self._popen is None:
            return True
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        _forget(self)
        return True

    def stop(self, timeout: float | None = None) -> int | None:
        """Ask it to shut down (`stop_signal`, and SIGCONT in case it is paused); SIGKILL it after `timeout` seconds.

        Idempotent. Returns the exit code (None when it never ran).
        """
        if self._popen is None:
            return None
        if self.running:
            self._ask_to_stop()
            if not self.wait(self.stop_timeout if timeout is None else timeout):
                return self.kill()
        return self._finish(set())

    def kill(self) -> int | None:
        """SIGKILL it (`whole_tree`: and every process it started): a crash. Returns the exit code."""
        if self._popen is None:
            return None
        family: set[int] = set()
        if self.running:
            pid = self._popen.pid
            if self.whole_tree:
                # Frozen, it forks nothing new while we list its children.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                family = _descendants(pid)
                # It leads its own session, so its pid is its group's id.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            for member in [pid, *family]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
        return self._finish(family)

    def restart(self) -> Self:
        """Stop it cleanly and start it again."""
        self.stop()
        return self.start()

    # -- its log ---------------------------------------------------------------------------------------

    def log_text(self) -> str:
        """What the current run has written so far."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON objects the current run has logged, one a line (other lines skipped)."""
        found = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    found.append(parsed)
        return found

    def logged(self, message: str) -> bool:
        """Whether the current run has logged a JSON line whose `msg` is `message`."""
        needle = json.dumps(message)
        for line in self.log_text().splitlines():
            if needle not in line:
                continue
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and parsed.get("msg") == message:
                    return True
        return False

    def tail(self, lines: int = 30) -> str:
        """The last lines of its log, for error messages."""
        return tail(self.log_path, lines)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, pid={self.pid})"

    # -- internals -------------------------------------------------------------------------------------

    def _exit_reason(self) -> str | None:
        code = self.exit_code
        return None if code is None else f"exited with code {code}"

    def _signal_tree(self, sig: Signals) -> None:
        if not self.running:
            return
        assert self._popen is not None
        family = _descendants(self._popen.pid) if self.whole_tree else set()
        for pid in [self._popen.pid, *family]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _ask_to_stop(self) -> None:
        self.signal(self.stop_signal)
        self.resume()

    def _finish(self, family: set[int]) -> int | None:
        """Reap the process and, with `whole_tree`, wait until its group and `family` are gone too."""
        assert self._popen is not None
        if self._stopped:
            return self._popen.returncode
        try:
            self._popen.wait(30)
        except subprocess.TimeoutExpired:
            raise EmbeddedServerError(f"{self.name} (pid {self._popen.pid}) does not exit, even SIGKILLed") from None
        _forget(self)
        if self.whole_tree:
            # SIGKILL takes effect at once, but a restart must not race a descendant still holding the
            # shared memory or the port; a clean shutdown has already waited for all of them.
            pid = self._popen.pid
            wait_until(lambda: not _alive(family, pid), timeout=10.0, what=f"{self.name} exit")
        self._stopped = True
        return self._popen.returncode


def _forget(child: ChildProcess) -> None:
    with _RUNNING_LOCK, contextlib.suppress(ValueError):
        _RUNNING.remove(child)


def stop_all(children: Sequence[ChildProcess], *, timeout: float) -> list[str]:
    """Ask every running child to stop, wait up to `timeout` seconds for all, SIGKILL the rest.

    Returns:
        The names of the children that had to be killed.
    """
    live = [child for child in children if child.running]
    for child in live:
        child._ask_to_stop()
    deadline = time.monotonic() + timeout
    killed: list[str] = []
    for child in live:
        if child.wait(max(0.0, deadline - time.monotonic())):
            child._finish(set())
        else:
            child.kill()
            killed.append(child.name)
    return killed


def popen(
    argv: Sequence[str], *, death_signal: signal.Signals = signal.SIGKILL, **kwargs: Any
) -> subprocess.Popen[str]:
    """`subprocess.Popen(argv, text=True, **kwargs)` for a child that talks over pipes, dying with us.

    For the few children that a `ChildProcess` (output to a log file) does not fit; the fork happens on a
    thread that lives as long as the process, so the parent-death signal holds.
    """
    return _SPAWNER.run(lambda: subprocess.Popen(list(argv), text=True, preexec_fn=_death_hook(death_signal), **kwargs))


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float,
    death_signal: signal.Signals = signal.SIGKILL,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end with its output captured as text, as `subprocess.run`, dying with us.

    Raises:
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is killed first).
    """
    popen = _SPAWNER.run(
        lambda: subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_death_hook(death_signal),
        )
    )
    with popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except BaseException:
            popen.kill()
            popen.wait()
            raise
    return subprocess.CompletedProcess(list(argv), popen.returncode, stdout, stderr)
