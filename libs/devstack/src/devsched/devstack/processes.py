"""Child processes of `devsched up`: the services, run by the supervisor of `devsched.embedded`.

Each child leads its own session, so a Ctrl-C in the terminal reaches only `devsched up`, which then
stops the children in order (`stop_all`). If `devsched up` itself dies, the kernel sends each child
SIGTERM (Linux), so that it shuts down cleanly too.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devsched.embedded.supervisor import ChildProcess, stop_all

__all__ = ["Child", "python_module", "stop_all"]


class Child(ChildProcess):
    """One service process of `devsched up`: `start()`, `stop()`, `kill()`, and a look at its JSON log lines.

    Args:
        name: For people (`scheduler`, `agent sim-1`).
        argv: The command.
        env: Its whole environment.
        log_path: Where stdout and stderr go (appended).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(name, argv, env, log_path, death_signal=signal.SIGTERM)


def python_module(module: str, *args: str) -> list[str]:
    """`python -m module args...` with the interpreter running us (the same environment)."""
    return [sys.executable, "-m", module, *args]
