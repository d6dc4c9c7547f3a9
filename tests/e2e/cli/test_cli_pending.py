"""`devsched ls` against the real services says why each queued task waits (its NOTE), as `get` does."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.devsched_stack import Devsched

pytestmark = pytest.mark.e2e

PLAN = "steps: [{name: hi, action: noop}]\n"


def _doc(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout)


def test_ls_notes_why_a_queued_task_waits(devsched: Devsched, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    name = f"waits-{uuid.uuid4().hex[:8]}"
    submitted = _doc(devsched("submit", str(plan), "--name", name, "--selector", "board=none-has-it", "--json"))
    try:
        listed = _doc(devsched("ls", "--status", "queued", "--json"))
        (task,) = [t for t in listed["tasks"] if t["task_id"] == submitted["task_id"]]
        assert task["pending_reason"] == "no_matching_device: no registered device matches the selector"
        assert _doc(devsched("get", submitted["task_id"], "--json"))["pending_reason"] == task["pending_reason"]

        shown = devsched("ls", "--status", "queued")  # a pipe, 200 columns: one line per task
        assert shown.returncode == 0, shown.stderr
        (row,) = [line for line in shown.stdout.splitlines() if name in line]
        assert "no_matching_device: no registered device matches the selector" in row, shown.stdout
    finally:
        devsched("cancel", submitted["task_id"])
