"""A step's `results` (checked at submit) and a step result's summary (an addition, issue 12)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devsched.core.errors import InvalidRequest
from devsched.core.status import Outcome
from devsched.protocol import messages as m
from devsched.protocol.codec import decode, encode
from devsched.protocol.plans import MAX_FAILED_LISTED, MAX_RESULTS_MESSAGE_CHARS, MAX_RESULTS_PATH_CHARS

from .samples import LEASE_ID, PLAN, RESULT, TASK_ID

pytestmark = pytest.mark.unit


def submit(results: Any) -> m.SubmitRequest:
    step = {"name": "tests", "action": "shell", "args": {"command": "pytest"}, "results": results}
    return decode(m.SubmitRequest, json.dumps({"plan": {"steps": [step]}}).encode())


@pytest.mark.parametrize("path", ["junit.xml", "reports/unit/junit.xml", "a b/ü.xml", ".hidden.xml", "x" * 255])
def test_a_relative_normalised_path_is_taken(path: str) -> None:
    step = submit({"junit": path}).plan.steps[0]
    assert step.results == m.ResultFiles(junit=path)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "the path is empty or holds a NUL byte"),
        ("/etc/passwd", "the path must be relative to the artifacts directory, not absolute"),
        ("../junit.xml", "the path must stay inside the artifacts directory ('..' is not allowed)"),
        ("reports/../../x.xml", "the path must stay inside the artifacts directory ('..' is not allowed)"),
        ("./junit.xml", "the path must be normalised (write 'junit.xml')"),
        ("reports//junit.xml", "the path must be normalised (write 'reports/junit.xml')"),
        ("reports/", "the path must be normalised (write 'reports')"),
        (".", "the path names no file"),
        ("x" * 256, "a part of the path is longer than 255 characters"),
        ("a/" * 600 + "x", f"the path is longer than {MAX_RESULTS_PATH_CHARS} characters"),
    ],
)
def test_a_path_that_could_leave_the_artifacts_directory_is_refused_with_its_field_path(
    path: str, message: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        submit({"junit": path})
    errors = err.value.details["errors"]
    assert [e["path"] for e in errors] == ["plan.steps.0.results.junit"]
    assert errors[0]["message"] == f"Value error, {message}"
    assert "\0" not in str(err.value)


@pytest.mark.parametrize(
    ("results", "path"),
    [
        ({}, "plan.steps.0.results.junit"),
        ({"junit": "a.xml", "tap": "b.tap"}, "plan.steps.0.results.tap"),
        ({"junit": 3}, "plan.steps.0.results.junit"),
        ("junit.xml", "plan.steps.0.results"),
    ],
)
def test_results_of_the_wrong_shape_are_refused(results: Any, path: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        submit(results)
    assert [e["path"] for e in err.value.details["errors"]] == [path]


def test_null_or_absent_results_leave_the_plan_as_it_was_written_before() -> None:
    assert submit(None).plan.steps[0].results is None
    assert b"results" not in encode(PLAN)
    assert b"results" not in encode(RESULT)  # nor a result without a summary
    with_results = m.Step(name="t", action="noop", results=m.ResultFiles(junit="j.xml"))
    assert json.loads(encode(with_results))["results"] == {"junit": "j.xml"}


SUMMARY = m.ResultsSummary(
    format="junit",
    tests=12,
    failures=2,
    errors=0,
    skipped=1,
    failed=[m.FailedTest(name="test_boot", classname="tests.Boot", message="no prompt"), m.FailedTest(name="t2")],
)


def test_a_summary_travels_in_a_report_and_back_in_the_task_view() -> None:
    step = m.StepResult(name="tests", status=m.StepStatus.DONE, exit_code=0, results=SUMMARY)
    report = m.ReportRequest(
        task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, outcome=Outcome.DONE, result=m.RunResult(steps=[step])
    )
    body = encode(report)
    assert decode(m.ReportRequest, body) == report
    stored = json.loads(body)["result"]  # what the scheduler keeps, as JSON
    assert stored["steps"][0]["results"] == {
        "format": "junit",
        "tests": 12,
        "failures": 2,
        "errors": 0,
        "skipped": 1,
        "failed": [
            {"name": "test_boot", "classname": "tests.Boot", "message": "no prompt"},
            {"name": "t2", "classname": None, "message": None},
        ],
        "error": None,
    }
    assert m.RunResult.model_validate(stored, strict=False).steps[0].results == SUMMARY


def test_a_reader_ignores_fields_a_newer_summary_adds() -> None:
    view = json.loads(encode(m.StepResult(name="tests", status=m.StepStatus.DONE, results=SUMMARY)))
    view["results"]["duration_s"] = 3.5
    view["results"]["failed"][0]["kind"] = "failure"
    run = decode(m.TaskSummary, _task_with_result({"steps": [view]}))
    assert run.result is not None
    assert run.result.steps[0].results == SUMMARY


def test_a_summary_past_its_limits_is_refused() -> None:
    too_many = [m.FailedTest(name=f"t{i}") for i in range(MAX_FAILED_LISTED + 1)]
    with pytest.raises(ValueError, match="at most 20 items"):
        m.ResultsSummary(format="junit", failed=too_many)
    with pytest.raises(ValueError, match="at most 1024 characters"):
        m.FailedTest(name="t", message="m" * (MAX_RESULTS_MESSAGE_CHARS + 1))
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        m.ResultsSummary(format="junit", tests=-1)


def _task_with_result(result: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "task_id": str(TASK_ID),
            "status": "done",
            "priority": 0,
            "max_attempts": 1,
            "attempt_count": 1,
            "cancel_requested": False,
            "selector": {"labels": {}},
            "plan": {"steps": [{"name": "tests", "action": "noop", "results": {"junit": "j.xml"}}]},
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "result": result,
        }
    ).encode()
