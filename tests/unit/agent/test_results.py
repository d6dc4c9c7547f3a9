"""Reading a step's JUnit results: on real files, the hostile ones included (links, FIFOs, bombs, XXE)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest

from devsched.agent.results import (
    MAX_DEPTH,
    MAX_RESULTS_BYTES,
    ResultsError,
    parse_junit,
    read_capped,
    read_results,
)
from devsched.agent.runner import PlanRunner, PlanStep
from devsched.core.status import Outcome
from devsched.protocol.codec import encode
from devsched.protocol.plans import (
    MAX_FAILED_LISTED,
    MAX_RESULTS_MESSAGE_CHARS,
    MAX_TEST_NAME_CHARS,
    FailedTest,
    ResultFiles,
    ResultsSummary,
    RunResult,
    StepStatus,
)

pytestmark = pytest.mark.unit

MakeRunner = Callable[..., PlanRunner]

JUNIT = ResultFiles(junit="junit.xml")

PYTEST_LIKE = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests">
  <testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6" time="0.05">
    <testcase classname="tests.test_flash" name="test_writes" time="0.001"/>
    <testcase classname="tests.test_flash" name="test_verifies" time="0.001">
      <failure message="assert 1 == 2">def test_verifies():
&gt;       assert 1 == 2
E       assert 1 == 2</failure>
    </testcase>
    <testcase classname="tests.test_flash" name="test_boots" time="0.001">
      <failure>AssertionError: no prompt within 30 s</failure>
    </testcase>
    <testcase classname="tests.test_usb" name="test_enumerates" time="0.001">
      <error message="failed on setup with &quot;OSError: no such device&quot;">OSError</error>
    </testcase>
    <testcase classname="tests.test_usb" name="test_hub" time="0.0">
      <skipped type="pytest.skip" message="no hub">skipped</skipped>
    </testcase>
    <testcase classname="tests.test_usb" name="test_ok" time="0.001"><system-out>fine</system-out></testcase>
  </testsuite>
</testsuites>
"""


def artifacts(tmp_path: Path) -> Path:
    directory = tmp_path / "artifacts"
    directory.mkdir(exist_ok=True)
    return directory


def read(tmp_path: Path, content: str | bytes | None = None, path: str = "junit.xml") -> ResultsSummary:
    directory = artifacts(tmp_path)
    if content is not None:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    return read_results(directory, ResultFiles(junit=path))


# -- what a valid file says ------------------------------------------------------------------------------


def test_a_pytest_file_with_failures_errors_and_skips_is_counted_from_its_test_cases(tmp_path: Path) -> None:
    summary = read(tmp_path, PYTEST_LIKE)
    assert summary == ResultsSummary(
        format="junit",
        tests=6,
        failures=2,
        errors=1,
        skipped=1,
        failed=[
            FailedTest(name="test_verifies", classname="tests.test_flash", message="assert 1 == 2"),
            # without a `message`, the start of the failure's text stands for it
            FailedTest(
                name="test_boots", classname="tests.test_flash", message="AssertionError: no prompt within 30 s"
            ),
            FailedTest(
                name="test_enumerates",
                classname="tests.test_usb",
                message='failed on setup with "OSError: no such device"',
            ),
        ],
    )


def test_a_single_testsuite_root_in_a_subdirectory_of_the_artifacts(tmp_path: Path) -> None:
    xml = '<testsuite name="s"><testcase name="a"/><testcase name="b"><failure message="x"/></testcase></testsuite>'
    summary = read(tmp_path, xml, path="reports/unit/junit.xml")
    assert (summary.error, summary.tests, summary.failures) == (None, 2, 1)
    assert summary.failed == [FailedTest(name="b", classname=None, message="x")]


def test_nested_suites_count_every_test_case_once(tmp_path: Path) -> None:
    xml = """<testsuites tests="99">
      <testsuite name="outer" tests="3" failures="1">
        <testsuite name="inner" tests="2" failures="1">
          <testcase name="deep-1"/><testcase name="deep-2"><failure message="no"/></testcase>
        </testsuite>
        <testcase name="shallow"><skipped/></testcase>
      </testsuite>
      <testsuite name="other"><testcase name="lone"><error/></testcase></testsuite>
    </testsuites>"""
    summary = read(tmp_path, xml)
    assert (summary.tests, summary.failures, summary.errors, summary.skipped) == (4, 1, 1, 1)
    assert [f.name for f in summary.failed] == ["deep-2", "lone"]
    assert summary.failed[1].message is None  # an error with neither message nor text


def test_suites_without_test_cases_are_counted_from_their_attributes(tmp_path: Path) -> None:
    xml = """<testsuites tests="100" failures="100">
      <testsuite name="a" tests="5" failures="1" errors="2" skipped="1"/>
      <testsuite name="b" tests="3" failures="0" errors="0" skipped="bogus"/>
    </testsuites>"""
    summary = read(tmp_path, xml)
    assert (summary.tests, summary.failures, summary.errors, summary.skipped) == (8, 1, 2, 1)  # `bogus`: 0
    assert summary.failed == []
    single = parse_junit(b'<testsuite tests="7" failures="2" errors="0" skipped="3"/>')
    assert (single.tests, single.failures, single.errors, single.skipped) == (7, 2, 0, 3)
    root_only = parse_junit(b'<testsuites tests="4" errors="4"/>')
    assert (root_only.tests, root_only.errors) == (4, 4)


def test_an_empty_suite_is_zero_tests_and_no_error(tmp_path: Path) -> None:
    summary = read(tmp_path, "<testsuites/>")
    assert summary == ResultsSummary(format="junit", tests=0, failures=0, errors=0, skipped=0, failed=[], error=None)


def test_failing_tests_are_listed_up_to_the_limit_and_long_texts_are_cut(tmp_path: Path) -> None:
    cases = "".join(
        f'<testcase classname="{"c" * 2000}" name="t{i}-{"n" * 2000}"><failure message="{"m" * 5000}"/></testcase>'
        for i in range(MAX_FAILED_LISTED + 5)
    )
    text_only = f"<testcase name='text'><failure>{'x' * 100_000}</failure></testcase>"
    summary = read(tmp_path, f"<testsuite>{text_only}{cases}</testsuite>")
    assert summary.failures == MAX_FAILED_LISTED + 6  # the counts cover every test
    assert len(summary.failed) == MAX_FAILED_LISTED
    first, second = summary.failed[0], summary.failed[1]
    assert first.name == "text"
    assert first.message is not None
    assert len(first.message) == MAX_RESULTS_MESSAGE_CHARS
    assert first.message.endswith("…")
    assert second.name.startswith("t0-")
    assert len(second.name) == MAX_TEST_NAME_CHARS
    assert second.classname is not None
    assert len(second.classname) == MAX_TEST_NAME_CHARS
    assert second.message is not None
    assert len(second.message) == MAX_RESULTS_MESSAGE_CHARS


def test_a_failure_outranks_an_error_and_a_skip_in_one_test_case(tmp_path: Path) -> None:
    xml = '<testsuite><testcase name="a"><skipped/><error message="e"/><failure message="f"/></testcase></testsuite>'
    summary = read(tmp_path, xml)
    assert (summary.tests, summary.failures, summary.errors, summary.skipped) == (1, 1, 0, 0)
    assert summary.failed == [FailedTest(name="a", message="f")]


# -- files that cannot be read: the summary says why ----------------------------------------------------


def test_a_missing_file(tmp_path: Path) -> None:
    summary = read(tmp_path, None)
    assert summary.error == "junit.xml (in the artifacts directory) does not exist"
    assert (summary.format, summary.tests, summary.failed) == ("junit", 0, [])
    assert read(tmp_path, None, path="reports/junit.xml").error == "reports (in the artifacts directory) does not exist"


def test_an_empty_file_is_malformed(tmp_path: Path) -> None:
    assert read(tmp_path, b"").error == "junit.xml: malformed XML: no element found at line 1, column 0"


def test_malformed_xml(tmp_path: Path) -> None:
    summary = read(tmp_path, "<testsuite><testcase name='a'></testsuite>")
    assert summary.error == "junit.xml: malformed XML: mismatched tag at line 1, column 32"


def test_xml_that_is_not_junit(tmp_path: Path) -> None:
    summary = read(tmp_path, "<html><body/></html>")
    assert summary.error == "junit.xml: not JUnit XML: the root element is <html>, not <testsuites> or <testsuite>"


def test_the_billion_laughs_is_refused(tmp_path: Path) -> None:
    bomb = '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    bomb += "".join(f' <!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">\n' for i in range(1, 10))
    bomb += ']>\n<testsuite name="&lol9;"/>\n'
    summary = read(tmp_path, bomb)
    assert summary.error == (
        "junit.xml: refused: the XML declares entities (entity expansion and external entities are not read)"
    )


def test_an_external_entity_is_refused_and_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    xxe = f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file://{secret}">]>'
    xxe += '<testsuite><testcase name="&x;"><failure message="&x;"/></testcase></testsuite>'
    summary = read(tmp_path, xxe)
    assert summary.error is not None
    assert summary.error.startswith("junit.xml: refused: ")
    assert "s3cret" not in summary.model_dump_json()
    dtd = f'<?xml version="1.0"?><!DOCTYPE testsuite SYSTEM "file://{secret}"><testsuite/>'
    assert read(tmp_path, dtd).error == "junit.xml: refused: the XML references an external resource"


def test_elements_nested_too_deep_are_refused(tmp_path: Path) -> None:
    deep = "<testsuites>" + "<testsuite>" * MAX_DEPTH + "</testsuite>" * MAX_DEPTH + "</testsuites>"
    assert read(tmp_path, deep).error == f"junit.xml: elements are nested more than {MAX_DEPTH} deep"


def test_a_symlink_to_a_file_outside_is_refused(tmp_path: Path) -> None:
    (artifacts(tmp_path) / "junit.xml").symlink_to("/etc/passwd")
    summary = read(tmp_path)
    assert summary.error == (
        "junit.xml (in the artifacts directory) is a symbolic link: "
        "results are read only from inside the artifacts directory"
    )


def test_a_symlink_even_to_a_file_inside_is_refused(tmp_path: Path) -> None:
    directory = artifacts(tmp_path)
    (directory / "real.xml").write_text("<testsuite/>")
    (directory / "junit.xml").symlink_to(directory / "real.xml")
    assert "is a symbolic link" in (read(tmp_path).error or "")


def test_a_symlinked_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "junit.xml").write_text(PYTEST_LIKE)
    (artifacts(tmp_path) / "reports").symlink_to(outside)
    summary = read(tmp_path, path="reports/junit.xml")
    assert summary.error == (
        "reports (in the artifacts directory) is a symbolic link: "
        "results are read only from inside the artifacts directory"
    )


def test_an_artifacts_directory_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "junit.xml").write_text(PYTEST_LIKE)
    (tmp_path / "artifacts").symlink_to(outside)
    summary = read_results(tmp_path / "artifacts", JUNIT)
    assert summary.error == (
        "the artifacts directory is a symbolic link: results are read only from inside the artifacts directory"
    )
    assert read_results(tmp_path / "gone", JUNIT).error == "the artifacts directory does not exist"
    assert read_results(None, JUNIT).error == "the step ran without an artifacts directory"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (artifacts(tmp_path) / "junit.xml").mkdir()
    assert read(tmp_path).error == "junit.xml is a directory, not a file"
    (artifacts(tmp_path) / "file").write_text("x")
    assert read(tmp_path, path="file/junit.xml").error == "file (in the artifacts directory) is not a directory"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(artifacts(tmp_path) / "junit.xml")
    assert read(tmp_path).error == "junit.xml is not a regular file"


def test_a_hard_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.xml"
    elsewhere.write_text(PYTEST_LIKE)
    os.link(elsewhere, artifacts(tmp_path) / "junit.xml")
    summary = read(tmp_path)
    assert summary.error == "junit.xml has 2 hard links (refused: it may be a file of someone else)"


def test_a_file_above_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    with open(artifacts(tmp_path) / "junit.xml", "wb") as handle:
        handle.truncate(MAX_RESULTS_BYTES + 1)  # sparse: the size is what counts
    assert read(tmp_path).error == f"junit.xml is {MAX_RESULTS_BYTES + 1} bytes, above the 16 MiB limit"
    with open(artifacts(tmp_path) / "junit.xml", "wb") as handle:
        handle.truncate(MAX_RESULTS_BYTES)
    # at the limit it is read (and this one is not XML)
    assert (read(tmp_path).error or "").startswith("junit.xml: malformed XML: ")
    # one that grows after the check is cut off all the same
    with open(artifacts(tmp_path) / "junit.xml", "ab") as handle:
        handle.write(b"x")
    fd = os.open(artifacts(tmp_path) / "junit.xml", os.O_RDONLY)
    try:
        with pytest.raises(ResultsError, match=r"junit\.xml grew above the 16 MiB limit while it was read"):
            read_capped(fd, "junit.xml")
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user needs root to make")
def test_with_a_step_user_a_file_it_does_not_own_is_refused(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    directory = artifacts(tmp_path)
    (directory / "junit.xml").write_text(PYTEST_LIKE)
    assert read_results(directory, JUNIT, owner=nobody.pw_uid).error == (
        f"junit.xml is not owned by the step user (uid {os.geteuid()})"
    )
    os.chown(directory / "junit.xml", nobody.pw_uid, nobody.pw_gid)
    assert read_results(directory, JUNIT, owner=nobody.pw_uid).tests == 6


# -- the runner reads them when the step ends, whatever its status -----------------------------------------


def writes(name: str, xml: str, then: str = "true", path: str = "junit.xml", **options: object) -> PlanStep:
    """A shell step that writes `xml` to `path` in its artifacts directory, then runs `then`."""
    command = f"cat > \"$DEVSCHED_ARTIFACTS_DIR/{path}\" <<'EOF'\n{xml}\nEOF\n{then}"
    return PlanStep(name, "shell", {"command": command}, results=ResultFiles(junit=path), **options)  # type: ignore[arg-type]


async def test_the_runner_summarises_a_step_that_failed_and_leaves_the_outcome_to_the_step(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    runner = make_runner(
        [
            writes("tests", PYTEST_LIKE, then="exit 1"),
            PlanStep("after", "noop", results=JUNIT),
        ],
        tmpdir=str(tmp_path),
        artifacts_dir=str(artifacts(tmp_path)),
    )
    result = await runner.run()
    assert (result.outcome, result.reason) == (Outcome.FAILED, "step 'tests' failed with exit code 1")
    tests, after = result.steps
    assert tests.status is StepStatus.FAILED
    assert tests.results == read_results(artifacts(tmp_path), JUNIT)
    assert tests.results is not None
    assert (tests.results.tests, tests.results.failures, tests.results.errors) == (6, 2, 1)
    assert after.status is StepStatus.SKIPPED
    assert after.results is None  # a step that never ran has nothing to read


async def test_a_timed_out_step_is_summarised_and_a_broken_file_changes_nothing(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    runner = make_runner(
        [
            writes("broken", "<testsuite>", path="broken.xml"),
            PlanStep("missing", "noop", results=ResultFiles(junit="missing.xml")),
            writes("hangs", '<testsuite><testcase name="slow"/></testsuite>', then="exec sleep 60", timeout_s=0.5),
        ],
        tmpdir=str(tmp_path),
        artifacts_dir=str(artifacts(tmp_path)),
    )
    result = await runner.run()
    broken, missing, hangs = result.steps
    assert (broken.status, missing.status, hangs.status) == (StepStatus.DONE, StepStatus.DONE, StepStatus.TIMED_OUT)
    assert (result.outcome, result.reason) == (Outcome.FAILED, "step 'hangs' timed out after 0.5 s")
    assert broken.results is not None
    assert broken.results.error == "broken.xml: malformed XML: no element found at line 2, column 0"
    assert missing.results is not None
    assert missing.results.error == "missing.xml (in the artifacts directory) does not exist"
    assert hangs.results is not None
    assert (hangs.results.tests, hangs.results.error) == (1, None)


async def test_steps_without_results_report_exactly_as_before(make_runner: MakeRunner, tmp_path: Path) -> None:
    runner = make_runner([PlanStep("plain", "noop")], artifacts_dir=str(artifacts(tmp_path)))
    result = await runner.run()
    assert result.outcome is Outcome.DONE
    assert b"results" not in encode(RunResult(steps=list(result.steps)))
