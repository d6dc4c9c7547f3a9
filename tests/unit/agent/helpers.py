"""Helpers shared by the agent's unit tests."""

from __future__ import annotations

from pathlib import Path

from devsched.agent.steps import RunIdentity

IDENTITY = RunIdentity(task_id="task-1", attempt=2, lease_id="lease-3", device_id="dev-4")


def process_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone: it holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def read_pid(path: Path) -> int | None:
    """The pid a step wrote to `path`, once it is there in full."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None
