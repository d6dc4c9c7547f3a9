"""A step's test results: its JUnit XML file, read safely from the attempt's artifacts directory and summarised.

The file is the step's, so it is read as untrusted input, by an agent that may be root:

- It is opened beneath the artifacts directory one part of the path at a time (`openat`), none of them
  followed if it is a symbolic link (`O_NOFOLLOW`), the directory itself included (a step user owns the
  attempt's directory and could swap `artifacts` for a link). What the file is then is checked on the open
  descriptor: a regular file (not a FIFO that would block, nor a device), with one link (a hard link could
  make a file the step cannot read the agent's to read), owned by the step user when steps run as one.
- At most `MAX_RESULTS_BYTES` are read, and parsing streams (SAX, no tree), with elements nested at most
  `MAX_DEPTH` deep, so memory stays bounded whatever the file holds.
- `defusedxml` refuses entity declarations (the billion laughs) and external references (XXE).

Nothing about the file changes how the step or the task ended: what goes wrong is the summary's `error`.
The functions do blocking I/O and parsing; call them from a thread in async code.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
import xml.sax
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.sax.handler import ContentHandler
from xml.sax.xmlreader import AttributesImpl

import defusedxml
import defusedxml.sax

from devsched.agent.steps import StepUser
from devsched.protocol.plans import (
    MAX_FAILED_LISTED,
    MAX_RESULTS_MESSAGE_CHARS,
    MAX_TEST_NAME_CHARS,
    FailedTest,
    ResultFiles,
    ResultsSummary,
)

logger = logging.getLogger(__name__)

#: Largest results file read; a larger one is refused unread.
MAX_RESULTS_BYTES = 16 * 1024 * 1024
_LIMIT = f"{MAX_RESULTS_BYTES // (1024 * 1024)} MiB"
#: Deepest nesting of elements accepted (JUnit files nest suites a few levels).
MAX_DEPTH = 64
#: Largest count taken from a suite's attributes (more digits are not a count of tests).
_MAX_COUNT = 10**12
_READ_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is then refused as not regular).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class ResultsError(Exception):
    """The results file cannot be read or is not JUnit XML; the message says why (it never quotes the file)."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- opening -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _refusal(exc: OSError, what: str) -> ResultsError:
    if exc.errno == errno.ENOENT:
        return ResultsError(f"{what} does not exist")
    if exc.errno == errno.ELOOP:
        return ResultsError(f"{what} is a symbolic link: results are read only from inside the artifacts directory")
    if exc.errno == errno.ENOTDIR:
        return ResultsError(f"{what} is not a directory")
    return ResultsError(f"{what} cannot be opened: {os.strerror(exc.errno or 0)}")


def _open_dir(path: str | Path, what: str, dir_fd: int | None = None) -> int:
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            # O_DIRECTORY is checked before O_NOFOLLOW: a link to a directory is "not a directory" too.
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    exc.errno = errno.ELOOP
        raise _refusal(exc, what) from None


def open_beneath(
    directory: Path, relative: str, *, owner: int | None = None, max_bytes: int | None = MAX_RESULTS_BYTES
) -> int:
    """Open `directory/relative` for reading without leaving `directory`; the caller closes the descriptor.

    Args:
        directory: the artifacts directory (its own last part is not followed either).
        relative: a normalised relative path (the protocol's `ResultFiles` checks it at submit).
        owner: the uid the file must belong to (the step user's), or None for any.
        max_bytes: the largest file accepted (a results file's limit by default), or None for any size.

    Raises:
        ResultsError: a part is missing or a link, or the file is not a single-linked regular file of `owner`.
    """
    parts = relative.split("/")
    if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ResultsError(f"{relative!r} is not a normalised relative path")
    fd = _open_dir(directory, "the artifacts directory")
    try:
        for i, part in enumerate(parts[:-1]):
            inner = _open_dir(part, f"{'/'.join(parts[: i + 1])} (in the artifacts directory)", fd)
            os.close(fd)
            fd = inner
        try:
            file_fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _refusal(exc, f"{relative} (in the artifacts directory)") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(file_fd)
        if stat.S_ISDIR(st.st_mode):
            raise ResultsError(f"{relative} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise ResultsError(f"{relative} is not a regular file")
        if st.st_nlink != 1:
            raise ResultsError(f"{relative} has {st.st_nlink} hard links (refused: it may be a file of someone else)")
        if owner is not None and st.st_uid != owner:
            raise ResultsError(f"{relative} is not owned by the step user (uid {st.st_uid})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ResultsError(f"{relative} is {st.st_size} bytes, above the {_LIMIT} limit")
    except BaseException:
        os.close(file_fd)
        raise
    return file_fd


def read_capped(fd: int, relative: str) -> bytes:
    """All of the file behind `fd`, refused if it holds more than `MAX_RESULTS_BYTES` (it may still grow)."""
    chunks, total = [], 0
    while chunk := os.read(fd, _READ_CHUNK):
        total += len(chunk)
        if total > MAX_RESULTS_BYTES:
            raise ResultsError(f"{relative} grew above the {_LIMIT} limit while it was read")
        chunks.append(chunk)
    return b"".join(chunks)


# -- parsing -------------------------------------------------------------------------------------------


def _local(name: str) -> str:
    """An element or attribute name without its namespace prefix."""
    return name.rpartition(":")[2]


def _count(attrs: AttributesImpl, name: str) -> int:
    value = (attrs.get(name) or "").strip()
    if not value.isdigit() or len(value) > 13:
        return 0
    return min(int(value), _MAX_COUNT)


@dataclass
class _Case:
    name: str
    classname: str | None
    #: `failure`, `error`, `skipped`, or None while it passed.
    outcome: str | None = None
    message: str | None = None
    #: Text of the failure while its element is open and it has no `message` attribute.
    text: list[str] | None = None
    text_chars: int = 0


@dataclass
class _Suites:
    """Counts taken from suite attributes: used only when the file has no test case at all."""

    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    def add(self, attrs: AttributesImpl) -> None:
        self.tests += _count(attrs, "tests")
        self.failures += _count(attrs, "failures")
        self.errors += _count(attrs, "errors")
        self.skipped += _count(attrs, "skipped")


#: Failure kinds, the first found in a test case deciding its outcome.
_RANK = {"failure": 0, "error": 1, "skipped": 2}


class JUnitHandler(ContentHandler):
    """Counts the test cases of a JUnit file as SAX events go by (no tree is built)."""

    def __init__(self) -> None:
        super().__init__()
        self.tests = self.failures = self.errors = self.skipped = 0
        #: The first failing test cases, in file order.
        self.failed: list[FailedTest] = []
        #: Local names of the open elements, the root first.
        self._stack: list[str] = []
        self._case: _Case | None = None
        self._root = _Suites()
        self._top: _Suites | None = None

    def startElement(self, name: str, attrs: AttributesImpl) -> None:  # noqa: N802 (SAX's name)
        """Open an element: the root's kind is checked, suites' attributes and test cases recorded."""
        tag, depth = _local(name), len(self._stack)
        if depth >= MAX_DEPTH:
            raise ResultsError(f"elements are nested more than {MAX_DEPTH} deep")
        if depth == 0:
            if tag not in ("testsuites", "testsuite"):
                raise ResultsError(
                    f"not JUnit XML: the root element is <{_cut(tag, 64)}>, not <testsuites> or <testsuite>"
                )
            self._root.add(attrs)
        elif depth == 1 and tag == "testsuite" and self._stack[0] == "testsuites":
            self._top = self._top or _Suites()
            self._top.add(attrs)
        parent = self._stack[-1] if self._stack else None
        self._stack.append(tag)
        case = self._case
        if tag == "testcase" and case is None:
            classname = attrs.get("classname")
            self._case = _Case(
                name=_cut(attrs.get("name") or "(unnamed)", MAX_TEST_NAME_CHARS),
                classname=_cut(classname, MAX_TEST_NAME_CHARS) if classname else None,
            )
        elif (
            tag in _RANK
            and parent == "testcase"
            and case is not None
            and (case.outcome is None or _RANK[tag] < _RANK[case.outcome])
        ):
            message = attrs.get("message")
            case.outcome = tag
            case.message = _cut(message, MAX_RESULTS_MESSAGE_CHARS) if message else None
            # Without a `message`, the start of the element's text stands for it.
            case.text = [] if not message and tag != "skipped" else None
            case.text_chars = 0

    def characters(self, content: str) -> None:
        """Keep the start of a failure's text, for a failure without a `message`."""
        case = self._case
        if case is not None and case.text is not None and self._stack[-1] in ("failure", "error"):
            room = MAX_RESULTS_MESSAGE_CHARS + 1 - case.text_chars
            if room > 0:
                case.text.append(content[:room])
                case.text_chars += min(len(content), room)

    def endElement(self, name: str) -> None:  # noqa: N802 (SAX's name)
        """Close an element: a failure's text becomes its message, a test case is counted."""
        tag = self._stack.pop()
        case = self._case
        if case is None or (tag != "testcase" and self._stack[-1:] != ["testcase"]):
            return
        if tag in ("failure", "error") and case.text is not None:
            text = "".join(case.text).strip()
            case.message = _cut(text, MAX_RESULTS_MESSAGE_CHARS) if text else None
            case.text = None
        elif tag == "testcase" and "testcase" not in self._stack:
            self._case = None
            self.tests += 1
            if case.outcome == "failure":
                self.failures += 1
            elif case.outcome == "error":
                self.errors += 1
            elif case.outcome == "skipped":
                self.skipped += 1
            if case.outcome in ("failure", "error") and len(self.failed) < MAX_FAILED_LISTED:
                self.failed.append(FailedTest(name=case.name, classname=case.classname, message=case.message))

    def summary(self) -> ResultsSummary:
        """The counts: of the test cases, or, in a file without any, of its suites' attributes."""
        if self.tests:
            counts = _Suites(self.tests, self.failures, self.errors, self.skipped)
        else:
            # The root `<testsuites>` may total its suites itself; its suites' own counts are preferred.
            counts = self._top or self._root
        return ResultsSummary(
            format="junit",
            tests=counts.tests,
            failures=counts.failures,
            errors=counts.errors,
            skipped=counts.skipped,
            failed=self.failed,
        )


def parse_junit(data: bytes) -> ResultsSummary:
    """The summary of a JUnit XML document (`<testsuites>` of `<testsuite>`s, or one `<testsuite>`).

    Raises:
        ResultsError: the document is not well-formed, declares entities, references outside resources,
            nests too deep, or its root is not a JUnit element.
    """
    handler = JUnitHandler()
    try:
        defusedxml.sax.parseString(data, handler)
    except defusedxml.EntitiesForbidden:
        raise ResultsError(
            "refused: the XML declares entities (entity expansion and external entities are not read)"
        ) from None
    except (defusedxml.ExternalReferenceForbidden, defusedxml.DTDForbidden):
        raise ResultsError("refused: the XML references an external resource") from None
    except defusedxml.DefusedXmlException as exc:
        raise ResultsError(f"refused: {type(exc).__name__}") from None
    except xml.sax.SAXParseException as exc:
        raise ResultsError(
            f"malformed XML: {exc.getMessage()} at line {exc.getLineNumber()}, column {exc.getColumnNumber()}"
        ) from None
    except xml.sax.SAXException as exc:
        raise ResultsError(f"malformed XML: {exc.getMessage()}") from None
    return handler.summary()


def read_results(artifacts_dir: Path | None, files: ResultFiles, *, owner: int | None = None) -> ResultsSummary:
    """The summary of a step's results file; never raises for what the file is or holds (that is `error`).

    Args:
        artifacts_dir: the attempt's artifacts directory; None when the agent has no work directory.
        files: the step's `results`.
        owner: the uid the file must belong to (the step user's), or None for any.
    """
    relative = files.junit
    try:
        if artifacts_dir is None:
            raise ResultsError("the step ran without an artifacts directory")
        with _closing(open_beneath(artifacts_dir, relative, owner=owner)) as fd:
            data = read_capped(fd, relative)
    except ResultsError as exc:
        return _failed(str(exc))
    except OSError as exc:
        return _failed(f"{relative} cannot be read: {os.strerror(exc.errno or 0)}")
    try:
        return parse_junit(data)
    except ResultsError as exc:
        return _failed(f"{relative}: {exc}")


async def summarise(
    files: ResultFiles | None, artifacts_dir: str | None, user: StepUser | None
) -> ResultsSummary | None:
    """The summary of a finished step's `results` (None when it declared none), read in a thread."""
    if files is None:
        return None
    directory = None if artifacts_dir is None else Path(artifacts_dir)
    summary = await asyncio.to_thread(read_results, directory, files, owner=None if user is None else user.uid)
    logger.info(
        "step results read",
        extra={"path": files.junit, "tests": summary.tests, "failures": summary.failures, "error": summary.error},
    )
    return summary


def _failed(why: str) -> ResultsSummary:
    return ResultsSummary(format="junit", error=_cut(why, MAX_RESULTS_MESSAGE_CHARS))
