"""`devsched resubmit`, against the real services: a new task with the plan, selector and options of the one
named (by its short id), a key of its own, its metadata naming the old task (which `get` shows); an unknown
id and a bad one are refused (a health check: tests/unit/web)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.devsched_stack import Devsched

pytestmark = pytest.mark.e2e

NOWHERE = "board=no-board-in-this-lab"


def doc(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


def test_resubmit_repeats_a_task_by_its_short_id(devsched: Devsched, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    request = {
        "plan": {"steps": [{"name": "a", "action": "noop"}]},
        "metadata": {"team": "qa"},
        "retry": {"on": ["infra"]},
        "queue_timeout_s": 600,
    }
    plan.write_text(json.dumps(request))
    first = doc(
        devsched(
            "submit", str(plan), "--selector", NOWHERE, "--name", "again", "--priority", "4",
            "--idempotency-key", f"key-{uuid.uuid4()}", "--json",
        )
    )  # fmt: skip
    old_id = str(first["task_id"])
    new_ids = []
    try:
        shown = devsched("resubmit", old_id[:8])
        assert shown.returncode == 0, shown.stderr
        assert f"a resubmit of {old_id}" in shown.stdout
        new_id = shown.stdout.split()[1]
        new_ids.append(new_id)
        again = doc(devsched("resubmit", old_id, "--json"))
        assert again["created"] is True
        new_ids.append(str(again["task_id"]))
        assert len({old_id, *new_ids}) == 3  # a new task each time: not the old key
        old, new = doc(devsched("get", old_id, "--json")), doc(devsched("get", new_id, "--json"))
        for field in ("plan", "selector", "name", "priority", "max_attempts", "lease_ttl_s", "retry"):
            assert new[field] == old[field], field
        assert new["metadata"] == {**old["metadata"], "resubmit_of": old_id}  # the link to the old task
        shown_new = devsched("get", new_id[:8])
        assert shown_new.returncode == 0, shown_new.stderr
        assert re.search(rf"resubmit of\s+{old_id}", shown_new.stdout), shown_new.stdout
        assert "resubmit of" not in devsched("get", old_id).stdout
        assert new["queue_timeout_s"] == old["queue_timeout_s"]
        assert new["idempotency_key"] != old["idempotency_key"]
        assert new["status"] == "queued"
    finally:
        for task_id in (old_id, *new_ids):
            devsched("cancel", task_id)


def test_resubmit_refuses_what_is_not_a_task(devsched: Devsched) -> None:
    missing = devsched("resubmit", str(uuid.uuid4()))
    assert missing.returncode == 4, missing.stderr
    assert missing.stdout == ""
    bad = devsched("resubmit", "3af5")
    assert bad.returncode == 2, bad.stderr
    assert "8 or more hex digits" in bad.stderr
