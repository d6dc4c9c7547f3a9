"""Child processes of `devsched up`: started in sessions of their own, logged to files, stopped by pid.

Each child leads its own session, so a Ctrl-C in the terminal reaches only `devsched up`, which then
stops the children in order. If `devsched up` itself dies, the kernel sends each child SIGTERM (Linux).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from devsched.embedded import parent_death_hook


class Child:
    """One service process: `start()`, `terminate()`, `kill()`, and a look at its JSON log lines.

    Args:
        name: For people (`scheduler`, `agent sim-1`).
        argv: The command.
        env: Its whole environment.
        log_path: Where stdout and stderr go (appended).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The pid while a process exists."""
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit code once it has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def start(self) -> None:
        """Start the process; its log is appended to `log_path`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_hook(signal.SIGTERM),
            )
        self.starts += 1

    def logged(self, message: str) -> bool:
        """Whether this run of the process has logged a JSON line whose `msg` is `message`."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return False
        needle = json.dumps(message)
        for line in text.splitlines():
            if needle not in line:
                continue
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and parsed.get("msg") == message:
                    return True
        return False

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log_path})"

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the process (by pid) if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process and reap it (a crash, for the demo)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the process to exit; True when it has."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


def stop_all(children: Sequence[Child], *, timeout: float) -> list[str]:
    """SIGTERM every running child, wait up to `timeout` seconds for all, SIGKILL the rest.

    Returns:
        The names of the children that had to be killed.
    """
    for child in children:
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed: list[str] = []
    for child in children:
        if not child.wait(max(0.0, deadline - time.monotonic())):
            child.kill()
            killed.append(child.name)
    return killed


def python_module(module: str, *args: str) -> list[str]:
    """`python -m module args...` with the interpreter running us (the same environment)."""
    return [sys.executable, "-m", module, *args]
