"""Test results with the real agent (issue 12): JUnit files a step leaves in `$DEVSCHED_ARTIFACTS_DIR`.

The agent reads the file when the step ends and the report carries the summary into the task view; a file
that is missing, malformed or a link out of the directory is the summary's `error` and changes no outcome.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from support.agent_e2e import AgentLab, ensure_step_user, shell, step_user_dir
from support.polling import eventually
from support.scheduler_harness import ErrorReply

pytestmark = pytest.mark.e2e

TTL_S = 5

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites>
  <testsuite name="flash" tests="4" failures="2" errors="0" skipped="1">
    <testcase classname="tests.test_flash" name="test_writes"/>
    <testcase classname="tests.test_flash" name="test_verifies">
      <failure message="checksum mismatch">trace</failure>
    </testcase>
    <testcase classname="tests.test_flash" name="test_boots"><failure>no prompt within 30 s</failure></testcase>
    <testcase classname="tests.test_flash" name="test_hub"><skipped message="no hub"/></testcase>
  </testsuite>
</testsuites>"""


def writing(name: str, xml: str, path: str = "junit.xml", then: str = "exit 0", **options: Any) -> dict[str, Any]:
    """A shell step that writes `xml` to `path` in its artifacts directory and declares it as its results."""
    command = (
        f'mkdir -p "$(dirname "$DEVSCHED_ARTIFACTS_DIR/{path}")"\n'
        f"cat > \"$DEVSCHED_ARTIFACTS_DIR/{path}\" <<'EOF'\n{xml}\nEOF\n{then}"
    )
    return shell(name, command, results={"junit": path}, **options)


def summary_of(view: dict[str, Any], step: str) -> dict[str, Any] | None:
    found = next(s for s in view["result"]["steps"] if s["name"] == step)
    return found.get("results")


async def test_a_step_with_failing_tests_that_exits_0_is_done_and_its_summary_names_them(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    task_id = await lab.submit(
        [writing("tests", JUNIT, path="reports/junit.xml"), shell("plain", "echo plain")], lease_ttl_s=TTL_S
    )
    view = await lab.wait_status(task_id, "done", "failed")
    assert (view["status"], view["reason"]) == ("done", None)  # failing tests do not fail a step that passed
    assert view["plan"]["steps"][0]["results"] == {"junit": "reports/junit.xml"}
    assert summary_of(view, "tests") == {
        "format": "junit",
        "tests": 4,
        "failures": 2,
        "errors": 0,
        "skipped": 1,
        "failed": [
            {"name": "test_verifies", "classname": "tests.test_flash", "message": "checksum mismatch"},
            {"name": "test_boots", "classname": "tests.test_flash", "message": "no prompt within 30 s"},
        ],
        "error": None,
    }
    assert "results" not in next(s for s in view["result"]["steps"] if s["name"] == "plain")
    # the attempt's record carries the same result, as reported
    assert view["attempts"][-1]["result"] == view["result"]
    assert agent.lines("step results read", path="reports/junit.xml", tests=4, failures=2)


async def test_missing_or_malformed_files_are_the_summarys_error_and_change_no_outcome(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    done = await lab.submit(
        [
            shell("missing", "echo no file", results={"junit": "junit.xml"}),
            writing("malformed", "<testsuite><testcase name='a'>", path="bad.xml"),
            writing("not-junit", "<html/>", path="page.xml"),
        ],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(done, "done", "failed")
    assert view["status"] == "done"
    assert summary_of(view, "missing") == {
        "format": "junit",
        "tests": 0,
        "failures": 0,
        "errors": 0,
        "skipped": 0,
        "failed": [],
        "error": "junit.xml (in the artifacts directory) does not exist",
    }
    malformed = summary_of(view, "malformed")
    assert malformed is not None
    assert malformed["error"] == "bad.xml: malformed XML: no element found at line 2, column 0"
    not_junit = summary_of(view, "not-junit")
    assert not_junit is not None
    assert not_junit["error"] == "page.xml: not JUnit XML: the root element is <html>, not <testsuites> or <testsuite>"

    # a step that fails keeps its own reason, and its results are read all the same
    failed = await lab.submit([writing("tests", JUNIT, then="exit 4")], lease_ttl_s=TTL_S)
    view = await lab.wait_status(failed, "done", "failed")
    assert (view["status"], view["reason"]) == ("failed", "step 'tests' failed with exit code 4")
    summary = summary_of(view, "tests")
    assert summary is not None
    assert (summary["tests"], summary["failures"], summary["error"]) == (4, 2, None)


async def test_a_results_path_linked_to_a_file_outside_is_refused(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    outside = lab.path("outside.xml")
    outside.write_text(JUNIT)
    task_id = await lab.submit(
        [
            shell("link", f'ln -s "{outside}" "$DEVSCHED_ARTIFACTS_DIR/junit.xml"', results={"junit": "junit.xml"}),
            shell("passwd", 'ln -s /etc/passwd "$DEVSCHED_ARTIFACTS_DIR/p.xml"', results={"junit": "p.xml"}),
            shell(
                "dir-link",
                f'ln -s "{outside.parent}" "$DEVSCHED_ARTIFACTS_DIR/reports"',
                results={"junit": "reports/outside.xml"},
            ),
        ],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "done", "failed")
    assert view["status"] == "done"
    why = "is a symbolic link: results are read only from inside the artifacts directory"
    for step, shown in (("link", "junit.xml"), ("passwd", "p.xml"), ("dir-link", "reports")):
        summary = summary_of(view, step)
        assert summary is not None
        assert summary["error"] == f"{shown} (in the artifacts directory) {why}", step
        assert (summary["tests"], summary["failed"]) == (0, [])
    assert "root:" not in str(view)


async def test_a_path_out_of_the_artifacts_directory_is_refused_at_submit(lab: AgentLab) -> None:
    with pytest.raises(ErrorReply) as err:
        await lab.submit([shell("t", "true", results={"junit": "../../etc/passwd"})])
    assert (err.value.status, err.value.code) == (400, "invalid_request")
    assert [e["path"] for e in err.value.details["errors"]] == ["plan.steps.0.results.junit"]


async def test_the_artifacts_directory_exists_when_a_step_runs_and_is_fresh_per_attempt(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    record = lab.path("record")
    record.mkdir()
    # Each attempt records its directory and what it found there, leaves a file, and the first one waits
    # (interruptibly) for the agent to be stopped, which gives the attempt back: the second runs on the
    # restarted agent.
    command = (
        'd="$DEVSCHED_ARTIFACTS_DIR"; n="$DEVSCHED_ATTEMPT"\n'
        f'test -d "$d" && test -w "$d" || exit 90\n'
        f'ls -A "$d" > "{record}/seen-$n"; echo "$d" > "{record}/dir-$n"\n'
        'echo "attempt $n" > "$d/left-by-$n"\n'
        f'touch "{record}/ready-$n"\n'
        'if [ "$n" = 1 ]; then exec sleep 600; fi'
    )
    task_id = await lab.submit([shell("look", command, interruptible=True)], lease_ttl_s=TTL_S, max_attempts=1)
    await eventually((record / "ready-1").exists, timeout=20, message="the first attempt ran")
    assert await agent.terminate() == 0
    await agent.start().ready()
    view = await lab.wait_status(task_id, "done", "failed", within=30)
    assert view["status"] == "done", view
    assert [a["status"] for a in view["attempts"]] == ["released", "done"]
    first, second = ((record / f"dir-{n}").read_text().strip() for n in (1, 2))
    assert (record / "seen-1").read_text() == ""
    assert (record / "seen-2").read_text() == ""  # nothing of the first attempt's
    assert first != second
    assert Path(first).name == Path(second).name == "artifacts"
    await eventually(lambda: not os.path.lexists(first), timeout=10, message="first attempt's directory removed")
    await eventually(lambda: not os.path.lexists(second), timeout=10, message="second attempt's directory removed")


async def test_as_step_user_the_artifacts_directory_is_its_own_and_its_results_are_read(lab: AgentLab) -> None:
    user = ensure_step_user()
    with step_user_dir(user) as reachable:
        await lab.agent("d1", work_dir=reachable / "work", step_user=user.pw_name).ready()
        probe = 'stat -c "artifacts=%a uid=%u" "$DEVSCHED_ARTIFACTS_DIR"; id -u'
        task_id = await lab.submit([writing("tests", JUNIT, then=probe)], lease_ttl_s=TTL_S)
        view = await lab.wait_status(task_id, "done", "failed")
    assert view["status"] == "done", view["result"]
    step = view["result"]["steps"][0]
    assert step["output_tail"] == f"artifacts=700 uid={user.pw_uid}\n{user.pw_uid}\n"
    assert step["results"]["error"] is None
    assert (step["results"]["tests"], step["results"]["failures"]) == (4, 2)
