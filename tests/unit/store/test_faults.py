"""Fault points: a process dies at the point its environment names, and only there."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import devsched.store
from devsched.store.faults import FAULT_POINT_ENV, POINTS

pytestmark = pytest.mark.unit

_CALL = "from devsched.store.faults import point; point('assign.after_reserve'); print('alive')"


def _run(armed: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != FAULT_POINT_ENV}
    if armed is not None:
        env[FAULT_POINT_ENV] = armed
    return subprocess.run([sys.executable, "-c", _CALL], env=env, capture_output=True, text=True, timeout=60)


def test_the_named_point_kills_the_process() -> None:
    done = _run("assign.after_reserve")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""
    assert "fault point assign.after_reserve: killing process" in done.stderr


@pytest.mark.parametrize("armed", [None, "", "sweep.after_expire"])
def test_any_other_point_or_none_is_passed(armed: str | None) -> None:
    done = _run(armed)
    assert (done.returncode, done.stdout) == (0, "alive\n")


def test_every_point_is_placed_once_in_the_store() -> None:
    modules = [p for p in Path(devsched.store.__file__).parent.rglob("*.py") if p.name != "faults.py"]
    sources = "".join(p.read_text() for p in modules)
    placed = re.findall(r'\bpoint\("([a-z_.]+)"\)', sources)
    assert sorted(placed) == sorted(POINTS)
