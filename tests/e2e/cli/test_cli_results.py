"""The CLI shows test results (issue 12): `get`, `watch` and `submit --wait`, as text and as JSON."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.devsched_stack import Devsched

pytestmark = pytest.mark.e2e

JUNIT = (
    '<testsuite name="flash">'
    '<testcase classname="tests.test_flash" name="test_writes"/>'
    '<testcase classname="tests.test_flash" name="test_verifies[usb-2]">'
    '<failure message="checksum mismatch&#10;at block 7"/></testcase>'
    '<testcase name="test_boots"><error>no prompt within 30 s</error></testcase>'
    '<testcase name="test_hub"><skipped/></testcase>'
    "</testsuite>"
)


def plan(tmp_path: Path) -> str:
    steps = [
        {
            "name": "tests",
            "action": "shell",
            "args": {"command": f"printf '%s' '{JUNIT}' > \"$DEVSCHED_ARTIFACTS_DIR/junit.xml\""},
            "results": {"junit": "junit.xml"},
        },
        {"name": "lint", "action": "shell", "args": {"command": "true"}, "results": {"junit": "lint.xml"}},
    ]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"steps": steps}))
    return str(path)


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


COUNTS = "junit: 4 tests, 1 failures, 1 errors, 1 skipped"
FAILING = ("✗ tests.test_flash.test_verifies[usb-2]: checksum mismatch", "✗ test_boots: no prompt within 30 s")
MISSING = "junit: not read: lint.xml (in the artifacts directory) does not exist"


def test_submit_wait_watch_and_get_show_each_steps_test_results(devsched: Devsched, tmp_path: Path) -> None:
    waited = ok(devsched("submit", plan(tmp_path), "-s", "platform=sim", "--wait"))
    assert f"step 'tests' {COUNTS}" in waited
    assert all(f"  {line}\n" in waited for line in FAILING), waited
    assert f"step 'lint' {MISSING}" in waited
    assert "at block 7" not in waited  # a message's first line only
    task_id = re.findall(r"task ([0-9a-f-]{36}) ", waited)[-1]

    watched = ok(devsched("watch", task_id))  # an ended task: its events, its summary, its results
    assert watched.index("done") < watched.index(f"step 'tests' {COUNTS}")
    assert all(line in watched for line in FAILING)

    shown = ok(devsched("get", task_id))
    assert "test results" in shown
    assert COUNTS in shown
    assert all(line in shown for line in FAILING), shown
    assert "lint.xml (in the artifacts directory) does not exist" in shown

    view: dict[str, Any] = json.loads(ok(devsched("get", task_id, "--json")))
    tests, lint = (s["results"] for s in view["result"]["steps"])
    assert (tests["tests"], tests["failures"], tests["errors"], tests["skipped"], tests["error"]) == (4, 1, 1, 1, None)
    assert tests["failed"] == [
        {"name": "test_verifies[usb-2]", "classname": "tests.test_flash", "message": "checksum mismatch\nat block 7"},
        {"name": "test_boots", "classname": None, "message": "no prompt within 30 s"},
    ]
    assert lint["error"] == "lint.xml (in the artifacts directory) does not exist"
    final = json.loads(ok(devsched("submit", plan(tmp_path), "-s", "platform=sim", "--wait", "--json")))
    assert final["result"]["steps"][0]["results"]["failed"] == tests["failed"]


def test_a_results_path_outside_the_artifacts_directory_is_refused_at_submit(
    devsched: Devsched, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("steps:\n  - {name: t, action: noop, results: {junit: /etc/passwd}}\n")
    result = devsched("submit", str(path), "-s", "platform=sim")
    assert result.returncode != 0
    assert "plan.steps.0.results.junit" in result.stderr
    assert "must be relative to the artifacts directory" in result.stderr
